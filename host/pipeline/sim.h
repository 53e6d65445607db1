/* The simulation of a table's lists (sim.c): times, buffers from the
 * values' lifetimes, and the validator (pipe_table_simulate, in
 * schedule.h). Private to host/pipeline. */
#ifndef MESHRUN_PIPELINE_SIM_H
#define MESHRUN_PIPELINE_SIM_H

#include "host/pipeline/schedule.h"

/* Times only: every action's t0 and t1 at costs c, sends never waited
 * and a send without its receive allowed (lists being built). 0, or
 * -EINVAL with err when the lists deadlock, -ENOMEM. */
int pipe_sim_times(struct pipe_table *t, const struct pipe_costs *c, char *err, size_t errlen);

/* From the times: each value a buffer of its stage, from the action that
 * makes it (or receives it) until its last reader on the stage ran and
 * its sends were taken, the lowest free one first (t->bufs, the actions'
 * buf); the activation sets likewise (t->act_sets, aset); the scratch
 * buffers (t->scratch). 0 or -ENOMEM. */
int pipe_assign_buffers(struct pipe_table *t);

#endif
