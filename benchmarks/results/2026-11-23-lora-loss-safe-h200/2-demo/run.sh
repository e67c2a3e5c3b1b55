python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || exit
R=benchmarks/results/2026-11-23-lora-loss-safe-h200
mkdir -p $OUT/w
timeout 540 bash $R/2-demo/demo.sh > $OUT/w/demo.log 2>&1; echo demo rc $?
grep -v Warn $OUT/w/demo.log | grep "loss .*grad rel err"
python3 -c "
import json,glob,os
for f in sorted(glob.glob(os.environ['OUT']+'/w/demo/*/metrics.jsonl')):
    v=[(r.get('step'),round(r['val_loss'],4)) for r in map(json.loads,open(f)) if r.get('val_loss') is not None]
    print(f.split('/')[-2], v)"
rm -f $OUT/w/demo/*/*.pt; cd $OUT && tar czf w.tgz w && rm -rf w/demo
