{
  "variables": {
    "weft_cuda%": "<!(node scripts/cuda.mjs)",
    "cuda_home%": "<!(node scripts/cuda.mjs home)",
    "cuda_gencode%": "<!(node scripts/cuda.mjs arch)"
  },
  "targets": [
    {
      "target_name": "weft_native",
      "sources": [
        "native/addon.cpp",
        "native/compute_thread.cpp",
        "native/model.cpp",
        "native/step.cpp",
        "native/weights.cpp",
        "native/attention.cpp",
        "native/sampling.cpp",
        "native/matmul.cpp",
        "native/kernels_amx.cpp",
        "native/kernels_avx512bf16.cpp",
        "native/kernels_avx512.cpp",
        "native/kernels_avx2.cpp",
        "native/kernels_scalar.cpp",
        "native/kernels_quant.cpp",
        "native/kernels_quant_avx2.cpp",
        "native/kernels_quant_panels.cpp",
        "native/kernels_quant_amx.cpp",
        "native/kernels_mlx.cpp",
        "native/kernels_mlx_avx2.cpp",
        "native/kernels_mlx_avx512.cpp",
        "native/quantize.cpp",
        "native/quant_panels.cpp",
        "native/kquant_rows.cpp",
        "native/roofline.cpp"
      ],
      "include_dirs": ["<!(node -p \"require('node-addon-api').include_dir\")"],
      "defines": ["NAPI_VERSION=8", "NAPI_CPP_EXCEPTIONS"],
      "cflags!": ["-fno-exceptions", "-O2"],
      "cflags_cc!": ["-fno-exceptions", "-fno-rtti", "-O2"],
      "cflags_cc": ["-O3", "-std=c++17", "-fopenmp", "-fno-math-errno", "-Wall", "-Wno-unused-function"],
      "ldflags": ["-fopenmp"],
      "libraries": ["-fopenmp"],
      "conditions": [
        ["weft_cuda==1", {
          "sources": ["native/cuda/cuda_model.cu", "native/cuda/cuda_kernels.cu", "native/cuda/cuda_attention.cu", "native/cuda/cuda_gemv.cu"],
          "libraries": ["-L<(cuda_home)/lib64", "-lcublas", "-lcudart", "-Wl,-rpath,<(cuda_home)/lib64"],
          "rules": [
            {
              "rule_name": "nvcc",
              "extension": "cu",
              "inputs": ["<(RULE_INPUT_PATH)", "native/cuda/cuda_kernels.h", "native/cuda/cuda_device.cuh", "native/cuda_backend.h", "native/step.h"],
              "outputs": ["<(INTERMEDIATE_DIR)/<(RULE_INPUT_ROOT).o"],
              "action": ["sh", "-c", "<(cuda_home)/bin/nvcc -std=c++17 -O3 <(cuda_gencode) -Xcompiler -fPIC,-fopenmp -I<(cuda_home)/include -c <(RULE_INPUT_PATH) -o <(INTERMEDIATE_DIR)/<(RULE_INPUT_ROOT).o"],
              "message": "nvcc <(RULE_INPUT_PATH)",
              "process_outputs_as_sources": 1
            }
          ]
        }, {
          "sources": ["native/cuda_stub.cpp"]
        }]
      ]
    }
  ]
}
