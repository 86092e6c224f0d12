#!/usr/bin/env bash
# The second command of the call, on the same warm machine (/tmp/real kept), as run (one line then):
# the default's long mix once more, then the multimodal adapter and a screenshot server started twice.
source tools/reference/gpu_call.sh; export CALL_S=300; R=/tmp/r2; mkdir -p $R
OUT=$R/d2 REVISION=8d02625-default2 SERVERS=chunked STAGES=bench CHUNK=1024 LONG_LEVEL_S=60 \
  timeout 150 bash tools/reference/gpu_prefix_bench.sh > /dev/null 2>&1; t "default2 rc $?"
grep -E "^long_chunked|chunks run|hardware" $R/d2/gpu_prefix_bench.log >> $CALL_LOG
python3 tools/reference/tail_beside.py $R/d2/long_chunked_with.samples.jsonl $R/d2/long_chunked_beside.samples.jsonl >> $CALL_LOG 2>&1
(cd tools/reference && timeout 60 python3 real_vl_goldens.py --model /tmp/real --adapter only > $R/adapter.log 2>&1); t "adapter rc $?"
for s in cold warm; do
  INSTINCT_BIND=127.0.0.1:8000 .carry/bin/instinct serve --model /tmp/real --text-adapter /tmp/real/adapter-text \
    --multimodal-adapter /tmp/real/adapter-multimodal --device cuda:0 > $R/vl_$s.log 2>&1 & pid=$!
  for _ in $(seq 90); do curl -sf http://127.0.0.1:8000/readyz > /dev/null && break; sleep 1; done
  kill $pid; wait $pid; t "vl $s"
  sed 's/\x1b\[[0-9;]*m//g' $R/vl_$s.log | grep -E "listening|weights|merged|loaded|ready" | cut -c1-220 >> $CALL_LOG
done
rm -rf $R/*/workloads; tar czf $OUT/runs2.tgz -C /tmp r2; cat $CALL_LOG
