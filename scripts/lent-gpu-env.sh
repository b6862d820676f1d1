# Sourced on a lent GPU machine (`. scripts/lent-gpu-env.sh`, as root) before
# scripts/cuda-check.sh and scripts/gpu-bench.sh: what those bare machines lack, from the Debian
# packages that `scripts/cuda-check.sh --build` packs beside the binaries. Each part is skipped
# where the machine has it already.
#   - The Vulkan loader and glvnd's libraries, which NVIDIA's Vulkan driver loads (without them
#     wgpu finds no adapter): unpacked over / (libraries alone, nothing else there to break),
#     the loader pointed at the driver's ICD file.
#   - Open MPI for the 2-rank checks, unpacked under a prefix of its own (OPAL_PREFIX).
#   - CUDA's libraries (cuBLAS, cuBLASLt, NVRTC) on the library path, from /usr/local/cuda and
#     PyTorch's wheels.
# shellcheck shell=bash
lent_packs=${ALPHA_CUDA_CHECK_DIR:-target/cuda-check}
if [[ $(ldconfig -p) != *libvulkan.so.1* ]] && [ -d "$lent_packs/vulkan-debs" ]; then
    if [ "$(id -u)" = 0 ]; then
        for lent_deb in "$lent_packs"/vulkan-debs/*.deb; do dpkg -x "$lent_deb" /; done
        ldconfig
    else
        echo "lent-gpu-env.sh: the Vulkan loader is missing and unpacking it over / needs root: no wgpu rows" >&2
    fi
fi
for lent_icd in /usr/share/vulkan/icd.d/nvidia_icd.json /etc/vulkan/icd.d/nvidia_icd.json \
    /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json; do
    if [ -z "${VK_DRIVER_FILES:-}" ] && [ -e "$lent_icd" ]; then export VK_DRIVER_FILES=$lent_icd; fi
done
if ! command -v mpirun >/dev/null && [ -d "$lent_packs/mpi-debs" ]; then
    lent_ompi=$(mktemp -d)
    for lent_deb in "$lent_packs"/mpi-debs/*.deb; do dpkg -x "$lent_deb" "$lent_ompi"; done
    ln -s mpirun.openmpi "$lent_ompi/usr/bin/mpirun"
    export OPAL_PREFIX=$lent_ompi/usr PATH=$lent_ompi/usr/bin:$PATH
    LD_LIBRARY_PATH=$lent_ompi/usr/lib/x86_64-linux-gnu:$lent_ompi/usr/lib/x86_64-linux-gnu/openmpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
for lent_lib in /usr/local/cuda/lib64 /opt/torch/.venv/lib/python3*/site-packages/nvidia/cu13/lib; do
    if [ -d "$lent_lib" ]; then LD_LIBRARY_PATH=$lent_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}; fi
done
export LD_LIBRARY_PATH
unset lent_packs lent_deb lent_icd lent_ompi lent_lib
