#!/bin/sh
# A local stand-in for python:3.11-slim, for build hosts that cannot reach Docker Hub (air-gapped,
# or only a Debian mirror and a PyPI mirror allowed): Debian bookworm (minbase) with Debian's own
# Python 3.11 and pip, from the Debian mirror, imported as the image nmt-offline-base:3.11. Then:
#
#   docker build --build-arg BASE_IMAGE=nmt-offline-base:3.11 -t nmt-serve .
#
# Run as root on a Debian/Ubuntu host with debootstrap and a Docker daemon. Environment:
#   MIRROR   Debian mirror (default http://deb.debian.org/debian)
#   TAG      image name (default nmt-offline-base:3.11)
#   EXTRA_CA a directory of *.crt files the image should trust too, e.g. a TLS-intercepting proxy's
#            (pip inside `docker build` fails with CERTIFICATE_VERIFY_FAILED without it)
#   ROOTFS   where the tree is built (default a temporary directory, removed afterwards)
set -eu
MIRROR=${MIRROR:-http://deb.debian.org/debian}
TAG=${TAG:-nmt-offline-base:3.11}
ROOTFS=${ROOTFS:-$(mktemp -d)}
cleanup() { [ -n "${KEEP_ROOTFS:-}" ] || rm -rf "$ROOTFS"; }
trap cleanup EXIT

debootstrap --variant=minbase --include=python3.11,python3-pip,ca-certificates bookworm "$ROOTFS" "$MIRROR"

# The official image's names: python, python3 and pip in /usr/local/bin, pip installing into the
# interpreter as root. Debian marks its Python as externally managed (PEP 668); an image is its own
# environment, so the marker goes (an ENV PIP_BREAK_SYSTEM_PACKAGES would leak into every image).
for name in python python3 python3.11; do ln -sf /usr/bin/python3.11 "$ROOTFS/usr/local/bin/$name"; done
printf '#!/bin/sh\nexec /usr/bin/python3.11 -m pip "$@"\n' > "$ROOTFS/usr/local/bin/pip"
chmod 755 "$ROOTFS/usr/local/bin/pip"
ln -sf pip "$ROOTFS/usr/local/bin/pip3"
rm -f "$ROOTFS"/usr/lib/python3.11/EXTERNALLY-MANAGED

if [ -n "${EXTRA_CA:-}" ]; then
    cp "$EXTRA_CA"/*.crt "$ROOTFS/usr/local/share/ca-certificates/"
    chroot "$ROOTFS" update-ca-certificates
fi

# As slim as the official image: no package lists, caches, documentation or bytecode.
rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/* "$ROOTFS"/usr/share/doc/* \
       "$ROOTFS"/usr/share/man/* "$ROOTFS"/usr/share/info/*
find "$ROOTFS/usr/lib/python3" "$ROOTFS/usr/lib/python3.11" -name __pycache__ -prune -exec rm -rf {} +

tar --numeric-owner -C "$ROOTFS" -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    --message "Debian bookworm minbase + python3.11 (deploy/offline-base.sh)" - "$TAG"
docker run --rm "$TAG" python -c "import ssl, sys; print(sys.version.split()[0], ssl.OPENSSL_VERSION)"
