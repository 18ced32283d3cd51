#!/usr/bin/env bash
# The MLP's products built for AVX2 and AVX-512 (src/fl/mlp_gemm_*.cpp)
# must define no symbol another file could bind to: a weak template
# instance compiled with -mavx512f that the linker kept in place of the
# baseline one would crash every caller on a CPU without AVX-512. Every
# symbol they define globally has to be in their own namespaces (Eigen's
# renamed one and xsilo::fl::gemm::<isa>).
set -euo pipefail
LIB="$1"
checked=0
for isa in avx2 avx512; do
  member="mlp_gemm_$isa.cpp.o"
  # nm prints "<archive>[<member>]:" or "<member>:" before each member's
  # symbols. Mangled names: the namespace a symbol is in comes first
  # (after _Z, and GV for a guard variable, Z for a static local, N and K),
  # whatever its return type.
  syms=$(nm --defined-only "$LIB" 2>/dev/null | awk -v m="$member" '
    /:$/ { inside = index($0, m) > 0; next }
    inside && NF >= 3 { print }')
  [ -n "$syms" ] || { echo "no symbols of $member in $LIB"; exit 1; }
  # Global binding: upper-case types, "u" (unique) and "V"/"W" (weak).
  global=$(echo "$syms" | awk '$2 ~ /^[A-Zu]$/ { print $3 }')
  eigen_ns="$((12 + ${#isa}))xsilo_eigen_$isa"
  gemm_ns="5xsilo2fl4gemm${#isa}$isa"
  bad=$(echo "$global" |
    grep -v -E "^_Z(GV)?Z?N?K?($eigen_ns|$gemm_ns)|^DW\.ref\.__gxx_personality_v0$" || true)
  if [ -n "$bad" ]; then
    echo "$member defines symbols outside its own namespaces:"
    echo "$bad" | head -20 | c++filt
    exit 1
  fi
  echo "$member: $(echo "$global" | wc -l) global symbols, all its own"
  checked=$((checked + 1))
done
[ "$checked" = 2 ]
