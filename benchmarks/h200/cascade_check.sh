# 2026-12-05: test_backends' flashinfer-cascade row failed on the H100 at HEAD (session_1205c.sh); the same test
# on HEAD and on 22ddeee (+ the isolation fix), full output, to tell a regression from an older failure.
set -uo pipefail
export PYTHONUNBUFFERED=1 FLASHINFER_CUDA_ARCH_LIST=9.0a
for t in new base; do mkdir -p /tmp/$t && tar xzf .device/trees/$t.tgz -C /tmp/$t; done
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .device/flashinfer/*.whl \
  .device/extra/*.whl && tar xzf .device/flashinfer/*-aot-*.tgz -C /tmp/site/flashinfer/data/ || echo "install failed"
for t in new base; do
  echo "== $t"
  (cd /tmp/$t && PYTHONPATH=/tmp/site:$PWD timeout 80 python3 -m pytest -q -p no:xdist -x tests/test_backends.py \
    -k "agrees_with_the_oracle and cascade" 2>&1 > $OUT/cascade_$t.log; grep -E "FAIL|assert|Error|passed|failed" $OUT/cascade_$t.log | head -12)
done
