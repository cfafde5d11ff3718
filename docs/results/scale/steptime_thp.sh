#!/bin/bash
# Step time of deeplabv3p-climate at its full input, batch 1: baseline vs sz rel 1e-2 (steptime.py from this
# directory's README, baseline and sz interleaved in one process), with PyTorch's transparent huge pages for CPU
# allocations (THP_MEM_ALLOC_ENABLE=1, the hpcdl command's default) and without; idle, then with one core held
# by a 1-thread torch loop. From the repository root: bash docs/results/scale/steptime_thp.sh >> docs/results/scale/steptime.txt
set -e
py=${PYTHON:-.venv/bin/python}
here=$(dirname "$0")
awk '/^## steptime.py/{f=1;next} f&&/^```python/{g=1;next} g&&/^```/{exit} g{print}' "$here/README.md" > /tmp/steptime.py
for load in idle loaded; do
  if [ $load = loaded ]; then
    $py -c "import torch; torch.set_num_threads(1); a = torch.randn(512, 512)
while True: a = (a @ a).tanh()" & hog=$!
  fi
  for thp in 1 0; do
    echo "== $load THP_MEM_ALLOC_ENABLE=$thp"
    OMP_WAIT_POLICY=PASSIVE THP_MEM_ALLOC_ENABLE=$thp $py /tmp/steptime.py 2 8 2>&1 | tail -4
  done
  if [ $load = loaded ]; then kill $hog; fi
done
