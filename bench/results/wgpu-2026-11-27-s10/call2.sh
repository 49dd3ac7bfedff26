#!/usr/bin/env bash
# Session 10, call 2 (#22), optional: the real MiniLM (fp16 safetensors, xz-compressed to fit the
# carry with the binary) on wgpu on the H100 with the cooperative-matrix kernels on
# (STREAMPOOL_WGPU_COOP_MATRIX=1): the `streampool-nn` wgpu suite, f32 and f16 against
# sentence-transformers (f16 bound: min cosine >= 0.999), then the same with them off.
# Carry [".dev-s10-wgpu-acc", ".gl"]; run: bash .dev-s10-wgpu-acc/call2.sh
set -u
D=$PWD/.dev-s10-wgpu-acc
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp
unxz_to() { python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],'wb'))" "$1" "$2"; }
B=/tmp/bin; mkdir -p $B; unxz_to $D/nn-wgpu.xz $B/nn-wgpu; chmod +x $B/nn-wgpu
M=/tmp/minilm-real; mkdir -p $M; cp -r $D/minilm/* $M/; unxz_to $D/model.safetensors.xz $M/model.safetensors
export STREAMPOOL_MINILM_DIR=$M
O=/tmp/call2; mkdir -p $O
for c in 1 0; do
  (cd crates/streampool-nn && STREAMPOOL_WGPU_COOP_MATRIX=$c timeout 150 $B/nn-wgpu --nocapture --test-threads 1 > $O/nn-wgpu-coop$c.log 2>&1; echo "nn wgpu suite COOP_MATRIX=$c exit $?")
  grep -hE "MiniLM|test result" $O/nn-wgpu-coop$c.log
done
cp $D/call2.sh $O/; tar cJf $OUT/call2.tar.xz -C /tmp call2
