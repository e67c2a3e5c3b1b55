python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || exit
mkdir -p $OUT/w
timeout 230 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_lora.py tests/test_verify_fp8.py tests/test_lora_analysis.py tests/test_fused_fp8.py tests/test_fused_swiglu.py tests/test_fused_head.py > $OUT/w/gpu-tests.log 2>&1; tail -3 $OUT/w/gpu-tests.log
timeout 320 bash scratch/demo.sh > $OUT/w/demo.log 2>&1; echo demo rc $?
python3 -c "
import json,glob,os
for f in sorted(glob.glob(os.environ['OUT']+'/w/demo/*/metrics.jsonl')):
    v=[(r.get('step'),round(r['val_loss'],4)) for r in map(json.loads,open(f)) if r.get('val_loss') is not None]
    print(f.split('/')[-2], v)"
ls $OUT/w/demo
cd $OUT && tar czf w.tgz w
