#!/usr/bin/env bash
# Google's T5 (t5 0.9.4, seqio 0.0.20, TensorFlow 2.20 for the CPU) in a venv of its own at $1, for
# tests/parity_test.py: bash .ci/t5_reference.sh DIR, then T5_TRAINING_REFERENCE_PYTHON=DIR/bin/python.
# Python 3.11; about 4 minutes on a 2-core machine. A venv that already imports them is kept.
set -euo pipefail
venv="${1:?usage: bash .ci/t5_reference.sh DIR}"
check='import t5.data.preprocessors, t5.evaluation.metrics, seqio; seqio.mixing_rate_num_examples'
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "$check" >/dev/null 2>&1; then
    exit 0
fi
python3 -m venv "$venv"
pip="$venv/bin/python -m pip install --quiet"
$pip tensorflow-cpu==2.20.0 absl-py babel gin-config editdistance immutabledict nltk pandas rouge-score \
    sacrebleu scikit-learn scipy sentencepiece packaging
# Without their declared dependencies, as the recipe measured on these machines: the lines above and
# below install what their preprocessors, metrics and mixing rates import.
$pip --no-deps tensorflow-text==2.20.1 t5==0.9.4 seqio==0.0.20
$pip jax pyglove clu tensorflow-datasets
"$venv/bin/python" -c "$check"
