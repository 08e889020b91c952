// A vectorized expf for the ISA files, included inside their `#pragma GCC
// target` region. Cody–Waite range reduction and a degree-6 polynomial:
// within 2 ulp of expf over the range softmax and SiLU use.
#pragma once

#define WEFT_EXP_CONSTANTS                                     \
  constexpr float kLog2e = 1.44269504088896341f;               \
  constexpr float kLn2Hi = 0.693359375f;                       \
  constexpr float kLn2Lo = -2.12194440e-4f;                    \
  constexpr float kP0 = 1.9875691500e-4f, kP1 = 1.3981999507e-3f, kP2 = 8.3334519073e-3f, \
                  kP3 = 4.1665795894e-2f, kP4 = 1.6666665459e-1f, kP5 = 5.0000001201e-1f;
