#!/usr/bin/env bash
# Regenerate nbhelpers/data/demo-speech.wav, the short English speech clip that the workbook uses when you bring
# no audio of your own. Made by this project with the espeak-ng speech synthesiser from our own text (see
# nbhelpers/data/README.md for the licence).
#
# Needs: espeak-ng (Debian/Ubuntu: apt-get install -y espeak-ng) and Python with imageio-ffmpeg (for ffmpeg).
# Usage: bash tools/make_demo_audio.sh [python]   (python defaults to `python3`)
set -euo pipefail

PYTHON="${1:-python3}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$ROOT/nbhelpers/data/demo-speech.wav"
TEXT="Hello! This is the MuseTalk workbook. Your lips should follow my words."

command -v espeak-ng >/dev/null || { echo "espeak-ng not found: apt-get install -y espeak-ng" >&2; exit 1; }
FFMPEG="$("$PYTHON" -c 'import imageio_ffmpeg; print(imageio_ffmpeg.get_ffmpeg_exe())')"

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

# American English voice, 180 words per minute, default pitch. espeak-ng writes 22.05 kHz mono 16-bit PCM.
espeak-ng -v en-us -s 180 -w "$WORK/raw.wav" "$TEXT"

# 16 kHz mono 16-bit PCM (the rate the pipeline uses), 0.25 s of silence before and after the words, no metadata
# chunks, so the file is small and byte-stable for a given espeak-ng version.
"$FFMPEG" -nostdin -hide_banner -loglevel error -y -i "$WORK/raw.wav" \
    -af "silenceremove=start_periods=1:start_threshold=-50dB,areverse,silenceremove=start_periods=1:start_threshold=-50dB,areverse,adelay=250:all=1,apad=pad_dur=0.25" \
    -ar 16000 -ac 1 -c:a pcm_s16le -map_metadata -1 -fflags +bitexact -flags:a +bitexact "$WORK/demo.wav"

mv "$WORK/demo.wav" "$OUT"
echo "wrote $OUT ($(stat -c %s "$OUT") bytes)"
