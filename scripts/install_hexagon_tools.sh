#!/usr/bin/env bash
# Best effort: install the tools that compile and run Hexagon HVX code under emulation
# (Debian's qemu-user, clang-16, lld-16). Exits 0 either way; the Hexagon emulation tests
# skip with the reason when the tools are still missing.
if command -v qemu-hexagon >/dev/null && command -v clang-16 >/dev/null && command -v ld.lld-16 >/dev/null; then
    exit 0
fi
SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo -n"
if command -v apt-get >/dev/null; then
    ($SUDO apt-get update -qq && $SUDO apt-get install -y -qq qemu-user clang-16 lld-16) >/dev/null 2>&1 \
        || echo "install_hexagon_tools: apt-get could not install qemu-user clang-16 lld-16; Hexagon emulation tests will skip" >&2
fi
exit 0
