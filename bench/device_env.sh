# Sourced by bench/gpu_session.sh and bench/device_runs.sh on a lent device machine: installs the wheels carried in
# .whl/ (bench/gpu_session.sh --download-wheels) and this package under /tmp/site, without network or dependency
# resolution (the machine has torch, numpy, scipy, pandas, matplotlib; not SB3, gymnasium, MinAtar, ale-py, rliable),
# and prints what it found. Expects PY (the python command) to be set.
nvidia-smi -L 2>/dev/null || echo "no nvidia-smi"
echo "$(getconf _NPROCESSORS_ONLN) CPU cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
if ! $PY -c "import stable_baselines3, minatar, ale_py, rliable" 2>/dev/null; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} || echo "WARNING: the wheels did not install"
fi
if ! $PY -c "import sb3_plastic.envs" 2>/dev/null; then
    # envs/ installs as sb3_plastic.envs, so a PYTHONPATH to the checkout alone is not enough
    $PY -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --target /tmp/site . \
        && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} || echo "WARNING: the package did not install"
fi
$PY - <<'PYEOF'
import torch, stable_baselines3, sb3_plastic
print(f"torch {torch.__version__}, cuda available {torch.cuda.is_available()}",
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
print(f"stable-baselines3 {stable_baselines3.__version__}, sb3_plastic at {sb3_plastic.__file__}")
PYEOF
