# syntax=docker/dockerfile:1
# trisolved in a container: the GPU image on the NVIDIA CUDA 13 images (the default), or a CPU
# image on any Debian/Ubuntu base, from this one file.
#   docker build -t trisolve .                                   (CUDA architectures 80, 86, 90 + PTX)
#   docker build -t trisolve --build-arg CUDA_ARCHITECTURES=90 .
#   docker build -t trisolve-cpu --build-arg BUILD_IMAGE=debian:bookworm \
#     --build-arg RUNTIME_IMAGE=debian:bookworm --build-arg TRISOLVE_CUDA=OFF .
#   podman build --format docker ...                              (podman: keeps the HEALTHCHECK)
# The build stage runs the same scripts as the README and CI (deploy/install-deps.sh reads
# deploy/packages.txt, the one dependency list; deploy/build.sh builds). deploy/container-test.sh
# builds the CPU image with podman on a Debian base made by debootstrap, runs it and solves
# through it (docs/deployment.md).
ARG CUDA_IMAGE_VERSION=13.0.0
ARG BUILD_IMAGE=nvidia/cuda:${CUDA_IMAGE_VERSION}-devel-ubuntu24.04
ARG RUNTIME_IMAGE=nvidia/cuda:${CUDA_IMAGE_VERSION}-runtime-ubuntu24.04

FROM ${BUILD_IMAGE} AS build
ARG CUDA_ARCHITECTURES="80-real;86-real;90-real;90-virtual"
# ON: the CUDA backend (fails without nvcc); OFF: the CPU backend only.
ARG TRISOLVE_CUDA=ON
ENV DEBIAN_FRONTEND=noninteractive
WORKDIR /src
COPY deploy/packages.txt deploy/install-deps.sh deploy/
RUN TRISOLVE_DEPS_SKIP=fuzz bash deploy/install-deps.sh && rm -rf /var/lib/apt/lists/*
COPY . .
# ccache (a package of the list) keeps its cache in /root/.cache/ccache: a build that mounts a
# kept folder there (podman build --volume, as container-test.sh does) recompiles only what changed.
RUN BUILD_DIR=/src/build TRISOLVE_CUDA_ARCHS="${CUDA_ARCHITECTURES}" \
    TRISOLVE_CMAKE_ARGS="-DBUILD_TESTING=OFF -DTRISOLVE_CUDA=${TRISOLVE_CUDA}" bash deploy/build.sh && \
    bash deploy/collect-runtime.sh /opt/trisolve build/server/trisolved build/client/trisolve

FROM ${RUNTIME_IMAGE}
RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin trisolve
COPY --from=build /opt/trisolve /opt/trisolve
# Inside the container the server listens on every interface of the container's own network
# namespace (that is how a published port or a compose network reaches it); what the host
# exposes is decided where the port is published: deploy/docker-compose.yml publishes on
# 127.0.0.1 unless the operator opts in (docs/deployment.md: TLS and tokens first).
ENV PATH=/opt/trisolve/bin:$PATH \
    LD_LIBRARY_PATH=/opt/trisolve/lib \
    TRISOLVE_LISTEN=0.0.0.0:50051 \
    TRISOLVE_SERVER=127.0.0.1:50051
USER trisolve
EXPOSE 50051
# grpc.health.v1 through the project's own CLI (exit 0 only when SERVING).
HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=3 \
    CMD ["trisolve", "--timeout", "3", "health"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["trisolved"]
