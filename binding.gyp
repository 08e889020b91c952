{
  "targets": [
    {
      "target_name": "weft_native",
      "sources": [
        "native/addon.cpp",
        "native/model.cpp",
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
        "native/kernels_quant_vnni.cpp",
        "native/kernels_mlx.cpp",
        "native/kernels_mlx_avx2.cpp",
        "native/kernels_mlx_avx512.cpp",
        "native/quantize.cpp",
        "native/roofline.cpp"
      ],
      "include_dirs": ["<!(node -p \"require('node-addon-api').include_dir\")"],
      "defines": ["NAPI_VERSION=8", "NAPI_CPP_EXCEPTIONS"],
      "cflags!": ["-fno-exceptions", "-O2"],
      "cflags_cc!": ["-fno-exceptions", "-fno-rtti", "-O2"],
      "cflags_cc": ["-O3", "-std=c++17", "-fopenmp", "-fno-math-errno", "-Wall", "-Wno-unused-function"],
      "ldflags": ["-fopenmp"],
      "libraries": ["-fopenmp"]
    }
  ]
}
