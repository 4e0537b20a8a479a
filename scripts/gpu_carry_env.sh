# Sourced on the GPU machine (bash): unpacks build-carry/carry.tar.xz (scripts/carry_binaries.sh) into /tmp/gc
# once per machine start (again when build-carry/COMMIT changes) and points the benches and tests at it.
mkdir -p /tmp/gc
if [ ! -f /tmp/gc/bin/COMMIT ] || ! cmp -s /tmp/gc/bin/COMMIT build-carry/COMMIT; then
  rm -rf /tmp/gc/*
  xz -T0 -dc build-carry/carry.tar.xz | tar -C /tmp/gc -xf -
fi
export LD_LIBRARY_PATH=/tmp/gc/lib:${LD_LIBRARY_PATH:-}
export BUILD_DIR=/tmp/gc/bin QTRAIN_TRAIN_EXE=/tmp/gc/bin/train PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit,clocks_throttle_reasons.active \
  --format=csv,noheader
echo "binaries of $(head -1 /tmp/gc/bin/COMMIT)"
