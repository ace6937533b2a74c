# issue 12 on the H200 (FlashInfer 0.6.18.post1 + flash-attn + SGLang already in /tmp/site): SGLang MLA campaigns, the cold 5-minute campaign over the FlashInfer + torch backends (fresh caches), warm cases/s
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .device/triton/*.whl 2>&1 | grep -v "already exists" | tail -2
export PYTHONPATH=/tmp/site:$PWD FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 PYTHONUNBUFFERED=1
mkdir -p $OUT/b2
timeout 60 python3 -m pa_oracle fuzz -b sglang-decode-mla -b sglang-extend-mla -n 200 --time-budget 40 --only q_dtypes=bfloat16 --out /tmp/sgl --overwrite > $OUT/b2/sglang.txt 2>&1; echo "sglang rc=$?" >> $OUT/b2/sglang.txt
grep -E "sglang-(decode|extend)-mla: (ok|INCOMPLETE|[0-9]+ FINDING)|rc=" $OUT/b2/sglang.txt | tail -4
B="-b flashinfer-decode -b flashinfer-decode-tc -b flashinfer-decode-hnd -b flashinfer-prefill-fa2 -b flashinfer-prefill-fa2-hnd -b flashinfer-prefill-fa3 -b flashinfer-ragged-fa2 -b flashinfer-cascade -b vllm-flashinfer -b sdpa-math -b sdpa-efficient -b flex"
timeout 370 python benchmarks/cold_campaign.py --time-budget 300 --log $OUT/b2/campaign.log $B > $OUT/b2/cold.txt 2>&1; echo "cold rc=$?" >> $OUT/b2/cold.txt
cat $OUT/b2/cold.txt | cut -c1-400
for b in sdpa-efficient flashinfer-decode-tc; do timeout 55 python benchmarks/fuzz_rate.py -b $b -n 150 2>&1 | grep -v Warning | tail -1; done | tee $OUT/b2/warm.txt
