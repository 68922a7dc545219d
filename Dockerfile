# syntax=docker/dockerfile:1
# trisolved on the NVIDIA container runtime.
#   docker build -t trisolve .                                   (CUDA architectures 80, 86, 90 + PTX)
#   docker build -t trisolve --build-arg CUDA_ARCHITECTURES=90 .
# The build stage runs the same scripts as the README and CI (deploy/install-deps.sh reads
# deploy/packages.txt, the one dependency list; deploy/build.sh builds).
ARG CUDA_IMAGE_VERSION=13.0.0

FROM nvidia/cuda:${CUDA_IMAGE_VERSION}-devel-ubuntu24.04 AS build
ARG CUDA_ARCHITECTURES="80-real;86-real;90-real;90-virtual"
ENV DEBIAN_FRONTEND=noninteractive
WORKDIR /src
COPY deploy/packages.txt deploy/install-deps.sh deploy/
RUN bash deploy/install-deps.sh && rm -rf /var/lib/apt/lists/*
COPY . .
RUN BUILD_DIR=/src/build TRISOLVE_CUDA_ARCHS="${CUDA_ARCHITECTURES}" \
    TRISOLVE_CMAKE_ARGS="-DBUILD_TESTING=OFF -DTRISOLVE_CUDA=ON" bash deploy/build.sh && \
    bash deploy/collect-runtime.sh /opt/trisolve build/server/trisolved build/client/trisolve

FROM nvidia/cuda:${CUDA_IMAGE_VERSION}-runtime-ubuntu24.04
RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin trisolve
COPY --from=build /opt/trisolve /opt/trisolve
ENV PATH=/opt/trisolve/bin:$PATH \
    LD_LIBRARY_PATH=/opt/trisolve/lib \
    TRISOLVE_LISTEN=0.0.0.0:50051 \
    TRISOLVE_SERVER=127.0.0.1:50051
USER trisolve
EXPOSE 50051
# grpc.health.v1 through the project's own CLI (exit 0 only when SERVING).
HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=3 \
    CMD ["trisolve", "--timeout", "3", "health"]
ENTRYPOINT ["trisolved"]
