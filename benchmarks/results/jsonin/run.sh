#!/bin/bash
# usage: run.sh TREE LABEL ARGS...   -> prints instructions per request (difference of two N)
tree=$1; label=$2; shift 2
[ -n "$A" ] && { a=$A; b=$B; } || case " $* " in *" --values 16 "*) a=400; b=1200;; *" --values 256 "*) a=100; b=300;; *) a=10; b=30;; esac
count() { env -C "$tree" PYTHONHASHSEED=0 PYTHONPATH="$tree" valgrind --tool=callgrind --callgrind-out-file=/dev/null \
  /work/main/.venv/bin/python /work/wt/jsonin/benchmarks/codec_loop.py "$1" "${@:2}" 2>&1 | sed -n 's/.*Collected : //p'; }
ca=$(count $a "$@"); cb=$(count $b "$@")
echo "$label $* : $(( (cb - ca) / (b - a) )) per request (N=$a:$ca N=$b:$cb) load: $(cut -d' ' -f1-3 /proc/loadavg)"
