/* float32 sums shared by the transport (sums on receive) and the
 * collectives. Element i is always a[i] + b[i]: one rounding, no
 * reassociation, so results are the same bits whichever routine computes
 * them (IEEE addition is commutative). */
#ifndef MESHRUN_FSUM_H
#define MESHRUN_FSUM_H

#include <stddef.h>

/* dst = a + b, elementwise; dst may not overlap a or b. */
void fsum_add(float *restrict dst, const float *restrict a, const float *restrict b, size_t n);
/* dst += a, elementwise; a may not overlap dst. */
void fsum_acc(float *restrict dst, const float *restrict a, size_t n);

#endif
