#!/bin/sh
# Add Lamplight to the Linux desktop's application menu (per user), or take it out again.
#
#   packaging/install-desktop.sh [--exec PATH]     # install the .desktop file and icons
#   packaging/install-desktop.sh --uninstall       # remove them
#
# Files go under ${XDG_DATA_HOME:-~/.local/share}: applications/lamplight.desktop and
# icons/hicolor/<size>/apps/lamplight.{png,svg}. The launcher runs PATH, by default the
# first that exists of: the bundle this script sits in, ./dist/lamplight/lamplight, the
# .venv's lamplight, lamplight on PATH. Works from a checkout and from a built bundle.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
data_home=${XDG_DATA_HOME:-$HOME/.local/share}
apps_dir=$data_home/applications
icons_dir=$data_home/icons/hicolor
sizes="16 24 32 48 64 128 256 512"

usage() { sed -n '2,10s/^# \{0,1\}//p' "$0"; }

die() { printf 'install-desktop: %s\n' "$*" >&2; exit 1; }

# resources/: beside packaging/ in a checkout, in _internal/ beside the app in a bundle.
find_resources() {
    for dir in "$here/_internal/resources" "$here/../resources"; do
        if [ -f "$dir/lamplight.desktop" ]; then (cd "$dir" && pwd); return; fi
    done
    die "cannot find resources/lamplight.desktop near $here"
}

find_exec() {
    for candidate in "$here/lamplight" "$here/../dist/lamplight/lamplight" "$here/../.venv/bin/lamplight"; do
        if [ -f "$candidate" ] && [ -x "$candidate" ]; then
            printf '%s\n' "$(cd "$(dirname "$candidate")" && pwd)/$(basename "$candidate")"
            return
        fi
    done
    command -v lamplight 2>/dev/null || die "no lamplight executable found; pass --exec PATH"
}

# An Exec= program argument, quoted as the Desktop Entry spec requires when needed.
exec_arg() {
    case $1 in
        *[!A-Za-z0-9/._+-]*)
            # Inside quotes, escape " ` $ \ with a backslash; then double every backslash
            # (the value is also a string that unescapes \\), and write % as %%.
            printf '"%s"' "$(printf '%s' "$1" | sed -e 's/[\\"`$]/\\&/g' -e 's/\\/\\\\/g' -e 's/%/%%/g')"
            ;;
        *) printf '%s' "$1" ;;
    esac
}

# (No update-desktop-database: the entry declares no MimeType, and its cache is shared.)
refresh_caches() {
    if command -v gtk-update-icon-cache >/dev/null 2>&1 && [ -f "$icons_dir/index.theme" ]; then
        gtk-update-icon-cache -q -t "$icons_dir" 2>/dev/null || true
    fi
}

uninstall() {
    rm -f "$apps_dir/lamplight.desktop" "$icons_dir/scalable/apps/lamplight.svg"
    for size in $sizes; do
        rm -f "$icons_dir/${size}x${size}/apps/lamplight.png"
        rmdir "$icons_dir/${size}x${size}/apps" "$icons_dir/${size}x${size}" 2>/dev/null || true
    done
    rmdir "$icons_dir/scalable/apps" "$icons_dir/scalable" 2>/dev/null || true
    refresh_caches
    printf 'Removed Lamplight from %s\n' "$data_home"
}

install() {
    exe=$1
    [ -x "$exe" ] || die "$exe is not an executable file"
    res=$(find_resources)
    mkdir -p "$apps_dir" "$icons_dir/scalable/apps"
    for size in $sizes; do
        png=$res/icons/lamplight-$size.png
        [ -f "$png" ] || die "missing $png (run packaging/make_icons.py)"
        mkdir -p "$icons_dir/${size}x${size}/apps"
        cp "$png" "$icons_dir/${size}x${size}/apps/lamplight.png"
    done
    cp "$res/icons/lamplight.svg" "$icons_dir/scalable/apps/lamplight.svg"
    # The shipped entry, with its program swapped for this one (its field codes are kept)
    # and TryExec added so that the entry hides itself if the program goes away.
    program=$(exec_arg "$exe")
    tryexec=$(printf '%s' "$exe" | sed 's/\\/\\\\/g')
    tmp=$apps_dir/.lamplight.desktop.$$
    # (Through the environment: awk -v would undo the backslash escapes.)
    LAMPLIGHT_EXEC=$program LAMPLIGHT_TRYEXEC=$tryexec awk '
        /^\[/ { in_entry = ($0 == "[Desktop Entry]") }
        in_entry && /^TryExec=/ { next }
        in_entry && /^Exec=/ {
            args = substr($0, 6); sub(/^[^ ]+/, "", args)
            print "TryExec=" ENVIRON["LAMPLIGHT_TRYEXEC"]
            print "Exec=" ENVIRON["LAMPLIGHT_EXEC"] args
            next
        }
        { print }
    ' "$res/lamplight.desktop" >"$tmp"
    chmod 644 "$tmp"
    mv "$tmp" "$apps_dir/lamplight.desktop"
    if command -v desktop-file-validate >/dev/null 2>&1; then
        desktop-file-validate "$apps_dir/lamplight.desktop"
    fi
    refresh_caches
    printf 'Installed Lamplight (%s) into %s\n' "$exe" "$data_home"
}

exe=""
action=install
while [ $# -gt 0 ]; do
    case $1 in
        --exec) [ $# -ge 2 ] || die "--exec needs a path"; exe=$2; shift 2 ;;
        --exec=*) exe=${1#--exec=}; shift ;;
        --uninstall) action=uninstall; shift ;;
        -h | --help) usage; exit 0 ;;
        *) usage >&2; exit 2 ;;
    esac
done

if [ "$action" = uninstall ]; then
    uninstall
else
    if [ -z "$exe" ]; then exe=$(find_exec); fi
    case $exe in /*) ;; *) exe=$(cd "$(dirname "$exe")" && pwd)/$(basename "$exe") ;; esac
    install "$exe"
fi
