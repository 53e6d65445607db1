/* The schedules besides the circular one (pipeline_schedule: gpipe,
 * 1f1b, interleaved_1f1b), each from its own table through the same
 * executor as check_pipeline's, across real agents on loopback: 10 steps
 * within 1e-4 of one device on the same global batch, reruns
 * bit-identical. Every combination the issue names is covered by at
 * least one case of each schedule (S in {2, 4}, M in {S, 2S, 4S},
 * recompute on and off, FSDP, tensor, layers outside the pipeline, dense
 * and DeepSeek-style MoE, whose load-balance loss needs a counting pass
 * in the schedules that back-propagate before the last forward); and the
 * circular schedule without recompute. A suite of its own so neither it
 * nor check_pipeline comes near run-all's limit on a loaded machine. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/equiv.h"

static void setup(void)
{
	proc_setup("meshrun-schedules", 0);
}

#define LLAMA "configs/llama-tiny.yml"
#define PP2 "ici_data_parallelism=1 ici_pipeline_parallelism=2"
#define DEEPSEEK "configs/deepseek-tiny.yml"
#define DS_SHORT "max_target_length=32"

static void schedule_cases(const char *sched)
{
	char kv[512];
	bool inter = !strcmp(sched, "interleaved_1f1b");
	/* S=4, M=8, recompute off: each chunk in flight keeps its layers' activations */
	snprintf(kv, sizeof(kv), "ici_data_parallelism=1 ici_pipeline_parallelism=4 num_pipeline_microbatches=8 "
		 "pipeline_schedule=%s pipeline_recompute=false%s", sched, inter ? "" : " num_layers_per_pipeline_stage=2");
	equivalence_opt(LLAMA, 1, 4, kv, "base_num_decoder_layers=8");
	/* S=2, M=8 (4S), FSDP=2 with the weights gathered once, poisoned */
	snprintf(kv, sizeof(kv), PP2 " ici_fsdp_parallelism=2 num_pipeline_microbatches=8 pipeline_schedule=%s "
		 "pipeline_fsdp_ag_once=true", sched);
	setenv("MESHRUN_TEST_PIPE_POISON", "1", 1);
	equivalence_batch(LLAMA, 1, 4, kv, inter ? "base_num_decoder_layers=4" : "", 16);
	unsetenv("MESHRUN_TEST_PIPE_POISON");
	/* S=2, M=2 (S), TP=2, the last 2 of a dense model's layers after the pipeline */
	snprintf(kv, sizeof(kv), PP2 " ici_tensor_parallelism=2 pipeline_schedule=%s pipeline_parallel_layers=%d "
		 "pipeline_recompute=false", sched, inter ? 4 : 2);
	equivalence_opt(LLAMA, 1, 4, kv, inter ? "base_num_decoder_layers=6" : "base_num_decoder_layers=4");
	/* DeepSeek-style MoE: the dense layer before the pipeline, S=2, M=4 (2S) */
	snprintf(kv, sizeof(kv), PP2 " num_pipeline_microbatches=4 pipeline_schedule=%s", sched);
	equivalence_opt(DEEPSEEK, 1, 2, kv, inter ? "base_num_decoder_layers=5 " DS_SHORT
						  : "base_num_decoder_layers=3 " DS_SHORT);
}

START_TEST(test_schedule_gpipe) { schedule_cases("gpipe"); }
END_TEST
START_TEST(test_schedule_1f1b) { schedule_cases("1f1b"); }
END_TEST
START_TEST(test_schedule_interleaved) { schedule_cases("interleaved_1f1b"); }
END_TEST
/* the circular schedule without recompute: MoE with repeats and FSDP */
START_TEST(test_circular_no_recompute)
{
	equivalence_opt(DEEPSEEK, 1, 4, PP2 " ici_fsdp_parallelism=2 num_pipeline_microbatches=4 "
			"pipeline_recompute=false pipeline_fsdp_ag_per_repeat=true", "base_num_decoder_layers=5 " DS_SHORT);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("pipeline_schedules");
	TCase *tc = tcase_create("schedules");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 400);
	tcase_add_test(tc, test_schedule_gpipe);
	tcase_add_test(tc, test_schedule_1f1b);
	tcase_add_test(tc, test_schedule_interleaved);
	tcase_add_test(tc, test_circular_no_recompute);
	suite_add_tcase(s, tc);
	SRunner *sr = srunner_create(s);
	/* no fork: the single-device baselines are cached across tests */
	srunner_set_fork_status(sr, CK_NOFORK);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
