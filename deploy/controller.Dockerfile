# sandboxd's own image from a binary built on this host, FROM the engine
# images' base (no registry needed). scripts/run.sh builds it under
# SANDBOXD_BACKEND=swarm, where sandboxd runs in a container attached to
# every sandbox's overlay (--probe-via network; docs/swarm.md, "Starting
# it"). The build context holds only the binary `sandboxd`.
#
# (deploy/Dockerfile builds the binary too, FROM the public Rust and Debian
# images, for a machine with a registry.)
ARG BASE=sandboxd/debian-base:trixie
FROM ${BASE}
RUN groupadd --system --gid 10001 sandboxd \
 && useradd --system --uid 10001 --gid sandboxd --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin sandboxd
COPY sandboxd /usr/local/bin/sandboxd
USER sandboxd:sandboxd
STOPSIGNAL SIGTERM
ENTRYPOINT ["sandboxd"]
CMD ["run"]
