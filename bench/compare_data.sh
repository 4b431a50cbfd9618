#!/usr/bin/env bash
# Token data side by side, RUNS rounds, medians:
#  - BPE training: `troupe data prepare --tokenizer bpe` vs sentencepiece's `spm_train
#    --model_type=bpe`, same training text, same vocabulary size;
#  - encoding: `troupe data encode` vs `spm_encode --output_format=id`, each with the tokenizer
#    it trained, over the whole corpus, ids as text to /dev/null;
#  - loading: `troupe bench data` (micro-batches as a worker assembles them) vs PyTorch's
#    DataLoader over a numpy.memmap of the same shards (bench/peers/torch_loader.py), 0 and 2
#    loader workers, at context 1024 x batch 8 (GPT-2 small's window) and 64 x 32 (the
#    quickstart's).
# The corpus: Linux 6.1's Documentation/ and drivers/net/ from Debian's linux-source-6.1 (the
# files that are UTF-8 text, ~170 MB), built once under $TROUPE_BENCH_DIR.
# Usage: bench/compare_data.sh [RUNS] [VOCAB] [TRAIN_MB]     (defaults 3, 8192, 20)
# Needs scripts/install-deps.sh --peers (sentencepiece, linux-source-6.1) and python3-torch.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-3}
VOCAB=${2:-8192}
TRAIN_MB=${3:-20}
TROUPE=$(realpath "${TROUPE:-build/bin/troupe}")
LOADER=$(realpath bench/peers/torch_loader.py)
WORK=${TROUPE_BENCH_DIR:-/tmp/troupe-data-bench}
TARBALL=/usr/src/linux-source-6.1.tar.xz
for tool in spm_train spm_encode; do
  command -v $tool >/dev/null || { echo "compare_data: $tool missing (scripts/install-deps.sh --peers)" >&2; exit 1; }
done
[[ -f $TARBALL ]] || { echo "compare_data: $TARBALL missing (scripts/install-deps.sh --peers)" >&2; exit 1; }
mkdir -p "$WORK"
cd "$WORK"
if [[ ! -f corpus.txt ]]; then
  echo "compare_data: building the corpus from $TARBALL" >&2
  tar xJf "$TARBALL" linux-source-6.1/Documentation linux-source-6.1/drivers/net
  /usr/bin/python3 - <<'PY'
import os
with open("corpus.tmp", "wb") as out:
    for root in ["linux-source-6.1/Documentation", "linux-source-6.1/drivers/net"]:
        for d, dirs, files in os.walk(root):
            dirs.sort()
            for f in sorted(files):
                b = open(os.path.join(d, f), "rb").read()
                if b"\0" in b:
                    continue
                try:
                    b.decode("utf-8")
                except UnicodeDecodeError:
                    continue
                out.write(b if b.endswith(b"\n") else b + b"\n")
os.rename("corpus.tmp", "corpus.txt")
PY
  rm -rf linux-source-6.1
fi
head -c $((TRAIN_MB * 1000000)) corpus.txt >train.txt
out=$WORK/results.jsonl
: >"$out"
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.3f", b - a }'; }
for ((r = 0; r < RUNS; r++)); do
  rm -rf tok full
  "$TROUPE" data prepare train.txt --out tok --tokenizer bpe --vocab "$VOCAB" --json |
    sed 's/^{/{"what":"train","impl":"troupe",/' >>"$out"
  t0=$(now)
  spm_train --input=train.txt --model_prefix=spm --model_type=bpe --vocab_size="$VOCAB" \
    --num_threads="$(nproc)" --minloglevel=2 >/dev/null 2>&1
  echo "{\"what\":\"train\",\"impl\":\"sentencepiece\",\"train_s\":$(since "$t0")}" >>"$out"
  t0=$(now)
  "$TROUPE" data encode --data tok <corpus.txt >/dev/null
  echo "{\"what\":\"encode\",\"impl\":\"troupe\",\"encode_s\":$(since "$t0")}" >>"$out"
  t0=$(now)
  spm_encode --model=spm.model --output_format=id <corpus.txt >/dev/null
  echo "{\"what\":\"encode\",\"impl\":\"sentencepiece\",\"encode_s\":$(since "$t0")}" >>"$out"
  "$TROUPE" data prepare corpus.txt --out full --tokenizer bpe --vocab "$VOCAB" --json |
    sed 's/^{/{"what":"prepare","impl":"troupe",/' >>"$out"
  for shape in "1024 8" "64 32"; do
    set -- $shape
    "$TROUPE" bench data --data full --context "$1" --batch "$2" --json | sed 's/^{/{"what":"load",/' >>"$out"
    for w in 0 2; do
      /usr/bin/python3 "$LOADER" --data full --context "$1" --batch "$2" --workers $w | sed 's/^{/{"what":"load",/' >>"$out"
    done
  done
done
/usr/bin/python3 - "$out" "$(stat -c %s corpus.txt)" "$TRAIN_MB" "$VOCAB" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
corpus, train_mb, vocab = int(sys.argv[2]) / 1e6, sys.argv[3], sys.argv[4]
med = lambda what, impl, key, **f: statistics.median(
    r[key] for r in rows if r["what"] == what and r["impl"] == impl and all(r.get(k) == v for k, v in f.items()))
cpu = open('/proc/cpuinfo').read().split('model name')[1].split(':')[1].splitlines()[0].strip()
print(f"host: {cpu}; corpus {corpus:.1f} MB (Linux 6.1 Documentation + drivers/net), vocabulary {vocab}; "
      f"medians of {sum(1 for r in rows if r['what'] == 'train' and r['impl'] == 'troupe')} runs")
t, s = med("train", "troupe", "train_s"), med("train", "sentencepiece", "train_s")
print(f"  BPE training on {train_mb} MB   troupe {t:7.2f} s   spm_train  {s:7.2f} s   speedup {s/t:6.1f}x  (goal >= 1x)")
t, s = med("encode", "troupe", "encode_s"), med("encode", "sentencepiece", "encode_s")
print(f"  encoding {corpus:.0f} MB         troupe {t:7.2f} s   spm_encode {s:7.2f} s   speedup {s/t:6.1f}x  (goal >= 1x)"
      f"   ({corpus/t:.1f} vs {corpus/s:.1f} MB/s)")
p = med("prepare", "troupe", "encode_s")
print(f"  troupe data prepare, whole corpus: encode + shards {p:.2f} s ({corpus/p:.1f} MB/s)")
for c, b in ((1024, 8), (64, 32)):
    t = med("load", "troupe", "tokens_per_s", context=c)
    us = med("load", "troupe", "batch_time_us", context=c)
    p0 = med("load", "torch_dataloader", "tokens_per_s", context=c, loader_workers=0)
    p2 = med("load", "torch_dataloader", "tokens_per_s", context=c, loader_workers=2)
    print(f"  loading {c}x{b}: troupe {t/1e6:8.1f} M tokens/s ({us:.1f} us a micro-batch)   DataLoader "
          f"0 workers {p0/1e6:6.1f}, 2 workers {p2/1e6:6.1f}   ratio to the better {t/max(p0, p2):6.1f}x  (goal >= 2x)")
PY
