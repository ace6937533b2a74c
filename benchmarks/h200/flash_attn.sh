# 2026-12-05, fourth session: flash-attn 2.8.3.post2 on the card, which no call of the day ran (its wheel set does not
# fit beside FlashInfer's). Carry .device/trees (new.tgz = `git archive HEAD`) and .device/flash-attn. The GPU tests
# that name flash-attn, the golden corpus replayed on its adapters (judged against the ledger), a 60 s campaign.
set -uo pipefail
export PYTHONUNBUFFERED=1
mkdir -p /tmp/new && tar xzf .device/trees/new.tgz -C /tmp/new
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .device/flash-attn/*.whl \
  .device/extra/*.whl 2>&1 | grep -v WARNING || true
cd /tmp/new && export PYTHONPATH=/tmp/site:$PWD
python3 -m pa_oracle env 2>&1 | grep -E "flash.attn|torch  " | head -14
FA="-b flash-attn-kvcache -b flash-attn-kvcache-paged -b flash-attn-kvcache-split4 -b flash-attn-varlen"
echo "== GPU tests"; timeout 200 python3 -m pytest -q -p no:xdist tests/test_backends.py tests/test_cuda_graphs.py -k "flash_attn or flash-attn" 2>&1 | tail -6
echo "== golden replay"; timeout 150 python3 -m pa_oracle replay golden/cases $FA 2>&1 | tail -25; echo "exit ${PIPESTATUS[0]}"
echo "== campaign 60 s"; timeout 150 python3 -m pa_oracle fuzz $FA --time-budget 60 --out $OUT/fa 2>&1 | grep -vE " variants: |^  \.\.\." | tail -14; echo "exit ${PIPESTATUS[0]}"
