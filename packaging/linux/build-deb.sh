#!/usr/bin/env bash
# Build dist/hearth_<version>_<arch>.deb from the PyInstaller bundle (dist/hearth, made by packaging/hearth.spec).
#
#   packaging/linux/build-deb.sh [BUNDLE_DIR] [OUT_DIR]
#
# Installs as: /opt/hearth/ (the bundle), /usr/bin/hearth (relative symlink), the .desktop entry, hicolor icons
# and the GGUF MIME type. Needs dpkg-deb (Debian's dpkg); no root: file ownership is set by --root-owner-group.
# DEB_COMPRESSION=zstd|xz|gzip|none (default zstd, read by dpkg 1.21.18+: Debian 12, Ubuntu 21.10 and later; the
# CPU .deb packs in ~30 s on 2 cores, where xz took over 15 min; use xz or gzip for older systems).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
bundle="${1:-$repo/dist/hearth}"
out="${2:-$repo/dist}"
compression="${DEB_COMPRESSION:-zstd}"

if [ ! -x "$bundle/hearth" ]; then
    echo "build-deb: no bundle at $bundle (run: pyinstaller packaging/hearth.spec, or make package)" >&2
    exit 1
fi
command -v dpkg-deb >/dev/null || { echo "build-deb: dpkg-deb is missing (apt-get install dpkg)" >&2; exit 1; }

# Which torch the bundle carries: GPU users get the CUDA build, everyone else the lean CPU one (README, Packaging).
if compgen -G "$bundle/_internal/torch/lib/libtorch_cuda*" >/dev/null; then flavour=cuda; else flavour=cpu; fi
version="$(sed -n 's/^__version__ = "\(.*\)"/\1/p' "$repo/app/__init__.py")"
arch="$(dpkg --print-architecture)"
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
root="$stage/hearth_${version}_${arch}"

install -d -m 755 "$root/opt" "$root/usr/bin" "$root/usr/share/applications" "$root/usr/share/mime/packages" \
    "$root/usr/share/doc/hearth" "$root/DEBIAN"
cp -a "$bundle" "$root/opt/hearth"
ln -s ../../opt/hearth/hearth "$root/usr/bin/hearth"
install -m 644 "$here/hearth.desktop" "$root/usr/share/applications/hearth.desktop"
install -m 644 "$here/hearth-mime.xml" "$root/usr/share/mime/packages/hearth.xml"
for size_dir in "$repo"/resources/icons/hicolor/*/; do
    size="$(basename "$size_dir")"
    install -d -m 755 "$root/usr/share/icons/hicolor/$size/apps"
    install -m 644 "$size_dir"apps/hearth.* "$root/usr/share/icons/hicolor/$size/apps/"
done
cat > "$root/usr/share/doc/hearth/copyright" <<COPYRIGHT
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: hearth
License: Apache-2.0
Comment: The bundle under /opt/hearth includes Python, PySide6 (Qt, LGPL-3.0), PyTorch (BSD-3-Clause),
 transformers, accelerate and bitsandbytes (Apache-2.0/MIT) and SmolLM2-135M-Instruct (Apache-2.0);
 their licence files are inside the bundle.
COPYRIGHT
chmod 644 "$root/usr/share/doc/hearth/copyright"

# Everything readable by all, nothing group/world-writable (dpkg-deb refuses odd modes in DEBIAN/).
chmod -R u+rwX,go+rX,go-w "$root/opt/hearth"
installed_kib="$(du -sk --apparent-size "$root" | cut -f1)"
sed -e "s/@VERSION@/$version/" -e "s/@ARCH@/$arch/" -e "s/@INSTALLED_SIZE@/$installed_kib/" \
    "$here/debian/control.in" > "$root/DEBIAN/control"
if [ "$flavour" = cuda ]; then
    echo " This build carries PyTorch with CUDA, for NVIDIA GPUs." >> "$root/DEBIAN/control"
else
    echo " This build carries the CPU-only PyTorch: models run on the CPU." >> "$root/DEBIAN/control"
fi
install -m 755 "$here/debian/postinst" "$here/debian/postrm" "$root/DEBIAN/"

mkdir -p "$out"
deb="$out/hearth_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Z"$compression" --build "$root" "$deb" >/dev/null
echo "$deb"
