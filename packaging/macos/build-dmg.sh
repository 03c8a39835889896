#!/usr/bin/env bash
# Build dist/Hearth-<version>.dmg from dist/Hearth.app (made by `pyinstaller packaging/hearth.spec` on macOS).
#
#   packaging/macos/build-dmg.sh [APP] [OUT_DIR]
#
# A compressed read-only disk image with the app and a link to /Applications to drag it onto. Uses only
# hdiutil (part of macOS). Signing and notarisation are separate steps that need an Apple Developer ID:
# set CODESIGN_IDENTITY to sign the app (and the image) before it is packed.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
app="${1:-$repo/dist/Hearth.app}"
out="${2:-$repo/dist}"

[ "$(uname -s)" = Darwin ] || { echo "build-dmg: runs on macOS only (needs hdiutil)" >&2; exit 1; }
[ -d "$app" ] || { echo "build-dmg: no app bundle at $app (run pyinstaller packaging/hearth.spec)" >&2; exit 1; }

version="$(sed -n 's/^__version__ = "\(.*\)"/\1/p' "$repo/app/__init__.py")"
if [ -n "${CODESIGN_IDENTITY:-}" ]; then
    codesign --force --deep --options runtime --timestamp --sign "$CODESIGN_IDENTITY" "$app"
fi

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
cp -R "$app" "$stage/"
ln -s /Applications "$stage/Applications"
cp "$repo/resources/icons/hearth.icns" "$stage/.VolumeIcon.icns"

mkdir -p "$out"
dmg="$out/Hearth-$version.dmg"
rm -f "$dmg"
hdiutil create -volname "Hearth $version" -srcfolder "$stage" -fs HFS+ -format UDZO -imagekey zlib-level=9 "$dmg"
if [ -n "${CODESIGN_IDENTITY:-}" ]; then
    codesign --force --timestamp --sign "$CODESIGN_IDENTITY" "$dmg"
fi
echo "$dmg"
