#!/usr/bin/env bash
# Build dist/Hearth-<version>-<arch>.AppImage from the PyInstaller bundle (dist/hearth).
#
#   APPIMAGETOOL=/path/to/appimagetool packaging/linux/build-appimage.sh [BUNDLE_DIR] [OUT_DIR]
#
# Why this cannot run from registry packages alone: an AppImage is a squashfs image appended to the AppImage
# runtime (a small static ELF that mounts it), and appimagetool, which joins the two, is published only as
# binaries on the AppImage project's GitHub releases. Neither Debian nor PyPI packages the runtime or
# appimagetool (PyPI's AppImage helpers download them at build time), so offline machines stop after the AppDir.
# The CI workflow (.github/workflows/package.yml) downloads appimagetool and builds the AppImage there.
# Without appimagetool this script still lays out the AppDir (build/Hearth.AppDir, or $APPDIR), prints why it
# stopped, and exits 3.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
bundle="${1:-$repo/dist/hearth}"
out="${2:-$repo/dist}"
appdir="${APPDIR:-$repo/build/Hearth.AppDir}"

[ -x "$bundle/hearth" ] || { echo "build-appimage: no bundle at $bundle (run make package)" >&2; exit 1; }

version="$(sed -n 's/^__version__ = "\(.*\)"/\1/p' "$repo/app/__init__.py")"
rm -rf "$appdir"
mkdir -p "$appdir/opt" "$appdir/usr/share/applications" "$appdir/usr/share/metainfo"
cp -a "$bundle" "$appdir/opt/hearth"
cat > "$appdir/AppRun" <<'APPRUN'
#!/bin/sh
# The AppImage's entry point: the bundled launcher (window with no arguments, command line with any).
here="$(dirname "$(readlink -f "$0")")"
exec "$here/opt/hearth/hearth" "$@"
APPRUN
chmod 755 "$appdir/AppRun"
install -m 644 "$here/hearth.desktop" "$appdir/hearth.desktop"
install -m 644 "$here/hearth.desktop" "$appdir/usr/share/applications/hearth.desktop"
install -m 644 "$repo/resources/icons/hicolor/256x256/apps/hearth.png" "$appdir/hearth.png"
ln -sf hearth.png "$appdir/.DirIcon"
for size_dir in "$repo"/resources/icons/hicolor/*/; do
    size="$(basename "$size_dir")"
    mkdir -p "$appdir/usr/share/icons/hicolor/$size/apps"
    cp "$size_dir"apps/hearth.* "$appdir/usr/share/icons/hicolor/$size/apps/"
done

tool="${APPIMAGETOOL:-$(command -v appimagetool || true)}"
if [ -z "$tool" ]; then
    echo "build-appimage: AppDir ready at $appdir; appimagetool is not installed and is not in any package" >&2
    echo "registry (it and the AppImage runtime come only from github.com/AppImage releases): set APPIMAGETOOL." >&2
    exit 3
fi
mkdir -p "$out"
image="$out/Hearth-$version-$(uname -m).AppImage"
ARCH="$(uname -m)" $tool --no-appstream "$appdir" "$image"
echo "$image"
