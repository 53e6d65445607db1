/* Which vector instructions the elementwise kernels run (kernels/isa.h):
 * the widest this CPU and its OS support, chosen once before main; a test
 * may pin another to compare the variants. */
#include <errno.h>

#include "kernels/isa.h"

enum kernel_isa kernel_isa_now = KERNEL_ISA_BASE;

#if defined(__x86_64__) && defined(__GNUC__)
enum kernel_isa kernel_isa_best(void)
{
	/* libgcc's cpu model checks the OS saves the wide registers (XGETBV) */
	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx512f"))
		return KERNEL_ISA_AVX512;
	if (__builtin_cpu_supports("avx2"))
		return KERNEL_ISA_AVX2;
	return KERNEL_ISA_BASE;
}
#else
enum kernel_isa kernel_isa_best(void)
{
	return KERNEL_ISA_BASE;
}
#endif

__attribute__((constructor)) static void kernel_isa_init(void)
{
	kernel_isa_now = kernel_isa_best();
}

int kernel_isa_set(enum kernel_isa isa)
{
	if ((int)isa < 0 || isa >= KERNEL_ISA_COUNT || isa > kernel_isa_best())
		return -ENOTSUP;
	kernel_isa_now = isa;
	return 0;
}

enum kernel_isa kernel_isa(void)
{
	return kernel_isa_now;
}

const char *kernel_isa_name(enum kernel_isa isa)
{
	static const char *const names[KERNEL_ISA_COUNT] = {
		[KERNEL_ISA_BASE] = "sse2",
		[KERNEL_ISA_AVX2] = "avx2",
		[KERNEL_ISA_AVX512] = "avx512f",
	};
	return (int)isa >= 0 && isa < KERNEL_ISA_COUNT ? names[isa] : "?";
}
