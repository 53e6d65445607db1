/* The builders' compute orders (orders.c), for the lowering (table.c):
 * each fills one stage's F, B, I and W actions (op, mb, chunk, iter) in
 * the order the stage runs them. Private to host/pipeline. */
#ifndef MESHRUN_PIPELINE_ORDERS_H
#define MESHRUN_PIPELINE_ORDERS_H

#include "host/pipeline/schedule.h"

/* Stage s's compute in order into out (pipe_order_max entries); returns
 * how many. The shape has passed pipe_shape_check. */
int pipe_order(const struct pipe_shape *p, int s, struct pipe_action *out);
int pipe_order_max(const struct pipe_shape *p);
/* The counting pass's forwards (PA_FC) of stage s; returns how many
 * (M x the stage's chunks). */
int pipe_order_count_pass(const struct pipe_shape *p, int s, struct pipe_action *out);

#endif
