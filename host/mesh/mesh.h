/* Device mesh (docs/sharding.md#the-mesh): axes in MaxText order, each of size
 * dcn(a)*ici(a); coordinate = dcn_idx*ici(a) + ici_idx; global device id =
 * row-major index of the coordinates; host = the DCN part. Groups are
 * computed from coordinates, never written down. */
#ifndef MESHRUN_MESH_H
#define MESHRUN_MESH_H

#include <stdint.h>

#include "host/config/config.h"

#define MESH_MAX_DEVICES 4096

struct mesh {
	int ici[AX_COUNT], dcn[AX_COUNT], size[AX_COUNT];
	int num_hosts, devices_per_host, num_devices;
};

/* A group: the devices that agree on every coordinate outside `axes`
 * (a bit mask of 1<<AX_*), in ring order: host-major, then local index.
 * For a single axis that is its coordinate order (DCN is the major part of
 * a coordinate); for several axes it is row-major over the axes unless an
 * ICI-only axis precedes a DCN axis in the set. */
struct mesh_group {
	uint32_t axes;
	uint32_t id;          /* same on every member; distinct per axes set */
	int n;                /* members */
	int rank;             /* this device's index in devs */
	int devs[MESH_MAX_DEVICES];
};

void mesh_init(struct mesh *m, const struct cfg *c);   /* after cfg_finish */
void mesh_coords(const struct mesh *m, int dev, int coord[AX_COUNT]);
int mesh_device(const struct mesh *m, const int coord[AX_COUNT]);
int mesh_host_of(const struct mesh *m, int dev);
/* index of dev among its host's devices, 0..devices_per_host-1 */
int mesh_local_index(const struct mesh *m, int dev);
/* global id of host h's i-th device */
int mesh_device_of(const struct mesh *m, int host, int local);
/* Devices in a group over axes: the product of their sizes. */
int mesh_axes_size(const struct mesh *m, uint32_t axes);
/* "a<sep>b..." for the n axes (AX_* values), or "none" when n is 0. */
void mesh_axes_text(const int *axes, int n, const char *sep, char *out, size_t outlen);
/* Fills g with dev's group over axes. */
void mesh_group(const struct mesh *m, int dev, uint32_t axes, struct mesh_group *g);

/* The coordinates of dev's group members over axes, in ring order (as
 * mesh_group lists them): where each member's block of a split tensor
 * goes. */
struct mesh_members {
	uint32_t axes;
	int n;
	int (*coord)[AX_COUNT];   /* n rows, malloc'd */
};
/* 0, or -ENOMEM. Free with mesh_members_free. */
int mesh_members_init(const struct mesh *m, int dev, uint32_t axes, struct mesh_members *out);
void mesh_members_free(struct mesh_members *x);

#endif
