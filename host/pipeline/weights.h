/* The weights of a table (weights.c): adds each stage's gathers,
 * releases and reduce-scatters to its lists by the shape's weight mode.
 * Private to host/pipeline (the lowering, table.c). */
#ifndef MESHRUN_PIPELINE_WEIGHTS_H
#define MESHRUN_PIPELINE_WEIGHTS_H

#include "host/pipeline/schedule.h"

/* Rewrites t->a[s] (and t->n[s]) of every stage with its weight
 * actions. 0 or -ENOMEM (the lists are then as before). */
int pipe_lower_weights(struct pipe_table *t);

#endif
