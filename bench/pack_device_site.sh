#!/usr/bin/env bash
# Build, here, the two xz tarballs that carry Ray and the benches' other missing packages to the GPU machine in one
# call (bench/device_batch.sh unpacks them there). The Ray wheel is 79 MB (deflate), over what one call carries
# next to anything else; unpacked and re-compressed with xz (x86 filter for its binaries) it is about 27 MB.
#
#   bash bench/pack_device_site.sh [DIR]     # DIR: default .raywhl (git-ignored: add /.raywhl/ to .git/info/exclude)
#
# DIR/ray-site.tar.xz : ray 2.60.0 (cp312 manylinux2014) + jsonschema 4.26.0, jsonschema-specifications, referencing,
#                       rpds-py: Ray's requirements that the GPU image lacks (it has click, filelock, msgpack,
#                       packaging, protobuf, pyyaml, requests, attrs, typing-extensions). Without ray/jars/ (34.5 MB,
#                       the Java worker's ray_dist.jar): ray/_private/services.py start_raylet() catches
#                       get_ray_jars_dir()'s error and starts no Java worker without it, as in a source build made
#                       without RAY_INSTALL_JAVA; ray-*.dist-info/RECORD has those lines dropped to match.
# DIR/deps-site.tar.xz: the .whl set that bench/device_run.sh installs (spandrel and spandrel-extra-arches too):
#                       diffusers 0.39.0, imageio-ffmpeg 0.6.0, soundfile + cffi + pycparser, soxr, importlib-metadata.
# DIR/SHA256SUMS      : checked there before unpacking.
# Each tarball holds a site folder as `pip install --no-deps --target` lays it out for CPython 3.12 on x86-64
# Linux (no bin/ scripts, no .pyc); unpacked there it is used through PYTHONPATH.
set -euo pipefail
DIR=${1:-.raywhl}
WHL=${WHL:-.whl}  # where the device_run.sh wheels already are (downloaded when missing)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
plat=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
      --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
mkdir -p "$DIR" "$TMP/dl" "$TMP/ray" "$TMP/deps"
python3 -m pip download -q --no-deps "${plat[@]}" -d "$TMP/dl" ray==2.60.0 jsonschema==4.26.0 \
  jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1
deps=(diffusers==0.39.0 imageio-ffmpeg==0.6.0 soundfile==0.14.0 cffi==2.1.1 pycparser==3.12 soxr==1.1.0
      importlib-metadata==10.2.0 spandrel==0.4.2 spandrel-extra-arches==0.2.0)
python3 -m pip download -q --no-deps "${plat[@]}" --platform any -d "$WHL" "${deps[@]}"
python3 -m pip install -q --no-deps --no-compile "${plat[@]}" --target "$TMP/ray" "$TMP"/dl/*.whl
python3 -m pip install -q --no-deps --no-compile "${plat[@]}" --target "$TMP/deps" --no-index --find-links "$WHL" \
  "${deps[@]}"
rm -rf "$TMP/ray/ray/jars" "$TMP/ray/bin" "$TMP/deps/bin"
sed -i '/^ray\/jars\//d' "$TMP"/ray/ray-*.dist-info/RECORD
sed -i '/^\.\.\/\.\.\/bin\//d' "$TMP"/*/*.dist-info/RECORD  # the scripts pip wrote (this machine's shebang)
for part in ray deps; do
  tar -C "$TMP/$part" --sort=name --owner=0 --group=0 -cf - . \
    | xz --x86 --lzma2=preset=9e,dict=64MiB -T2 -c > "$DIR/$part-site.tar.xz.tmp"
  mv "$DIR/$part-site.tar.xz.tmp" "$DIR/$part-site.tar.xz"
done
(cd "$DIR" && sha256sum ray-site.tar.xz deps-site.tar.xz > SHA256SUMS)
du -b "$DIR"/*
