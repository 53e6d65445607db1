/* `meshrun bench WHAT`: matmul peak, raw TLS link throughput, collectives.
 * Benchmarks print figures; they never pass or fail on speed. */
#include <stdio.h>
#include <string.h>

#include "host/bench/bench_coll.h"
#include "host/bench/bench_link.h"
#include "host/bench/bench_matmul.h"
#include "host/cli/cli.h"

int cmd_bench(int argc, char **argv)
{
	if (argc >= 2 && !strcmp(argv[1], "matmul"))
		return bench_matmul_main(argc - 1, argv + 1);
	if (argc >= 2 && !strcmp(argv[1], "link"))
		return bench_link_main(argc - 1, argv + 1);
	if (argc >= 2 && !strcmp(argv[1], "collectives"))
		return bench_coll_main(argc - 1, argv + 1);
	fprintf(stderr, "usage: meshrun bench matmul [--threads N] [--size N]\n"
			"       meshrun bench link --hosts 2 --sizes 16M[,64K] [--iters K] [--oneway]\n"
			"       meshrun bench collectives --hosts N [--devices-per-host D] --op OP "
			"--sizes 64K,1M,16M [--iters K] [--warmup W] [--barrier] [key=value ...]\n");
	return EXIT_USAGE;
}
