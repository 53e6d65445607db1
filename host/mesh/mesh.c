/* Mesh coordinates and groups; see host/mesh/mesh.h. */
#include "host/mesh/mesh.h"

#include <errno.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

void mesh_init(struct mesh *m, const struct cfg *c)
{
	memset(m, 0, sizeof(*m));
	m->num_devices = 1;
	for (int a = 0; a < AX_COUNT; a++) {
		m->ici[a] = c->ici[a];
		m->dcn[a] = c->dcn[a];
		m->size[a] = c->ici[a] * c->dcn[a];
		m->num_devices *= m->size[a];
	}
	m->num_hosts = c->num_hosts;
	m->devices_per_host = c->devices_per_host;
}

void mesh_coords(const struct mesh *m, int dev, int coord[AX_COUNT])
{
	for (int a = AX_COUNT - 1; a >= 0; a--) {
		coord[a] = dev % m->size[a];
		dev /= m->size[a];
	}
}

int mesh_device(const struct mesh *m, const int coord[AX_COUNT])
{
	int dev = 0;
	for (int a = 0; a < AX_COUNT; a++)
		dev = dev * m->size[a] + coord[a];
	return dev;
}

int mesh_host_of(const struct mesh *m, int dev)
{
	int c[AX_COUNT], h = 0;
	mesh_coords(m, dev, c);
	for (int a = 0; a < AX_COUNT; a++)
		h = h * m->dcn[a] + c[a] / m->ici[a];
	return h;
}

int mesh_local_index(const struct mesh *m, int dev)
{
	int c[AX_COUNT], l = 0;
	mesh_coords(m, dev, c);
	for (int a = 0; a < AX_COUNT; a++)
		l = l * m->ici[a] + c[a] % m->ici[a];
	return l;
}

int mesh_device_of(const struct mesh *m, int host, int local)
{
	int c[AX_COUNT];
	for (int a = AX_COUNT - 1; a >= 0; a--) {
		int hi = host % m->dcn[a], li = local % m->ici[a];
		host /= m->dcn[a];
		local /= m->ici[a];
		c[a] = hi * m->ici[a] + li;
	}
	return mesh_device(m, c);
}

void mesh_group(const struct mesh *m, int dev, uint32_t axes, struct mesh_group *g)
{
	int base[AX_COUNT], c[AX_COUNT];
	mesh_coords(m, dev, base);
	g->axes = axes;
	g->n = mesh_axes_size(m, axes);
	/* enumerate the group's members row-major over its axes */
	for (int i = 0; i < g->n; i++) {
		int r = i;
		memcpy(c, base, sizeof(c));
		for (int a = AX_COUNT - 1; a >= 0; a--) {
			if (!(axes & (1u << a)))
				continue;
			c[a] = r % m->size[a];
			r /= m->size[a];
		}
		g->devs[i] = mesh_device(m, c);
	}
	/* Ring order is host-major (docs/collectives.md#rings-and-segments): sort by (host, local index).
	 * Members differ only along the group's axes, so for one axis this is
	 * its coordinate order; for several it differs only when an ICI-only
	 * axis precedes a DCN axis in the set. Insertion sort: n is small. */
	for (int i = 1; i < g->n; i++) {
		int d = g->devs[i], hd = mesh_host_of(m, d), ld = mesh_local_index(m, d), j = i - 1;
		while (j >= 0) {
			int hj = mesh_host_of(m, g->devs[j]);
			if (hj < hd || (hj == hd && mesh_local_index(m, g->devs[j]) <= ld))
				break;
			g->devs[j + 1] = g->devs[j];
			j--;
		}
		g->devs[j + 1] = d;
	}
	for (int i = 0; i < g->n; i++)
		if (g->devs[i] == dev)
			g->rank = i;
	/* Groups over the same axes are disjoint, so the axes set alone keeps
	 * (src, dst, group, seq) unique; ids >= 512 are free for other uses. */
	g->id = axes & 0x1ff;
}

int mesh_axes_size(const struct mesh *m, uint32_t axes)
{
	int n = 1;
	for (int a = 0; a < AX_COUNT; a++)
		if (axes & (1u << a))
			n *= m->size[a];
	return n;
}

int mesh_members_init(const struct mesh *m, int dev, uint32_t axes, struct mesh_members *out)
{
	struct mesh_group *g = malloc(sizeof(*g));
	out->coord = g ? malloc(sizeof(*out->coord) * (size_t)mesh_axes_size(m, axes)) : NULL;
	if (!out->coord) {
		free(g);
		return -ENOMEM;
	}
	mesh_group(m, dev, axes, g);
	out->axes = axes;
	out->n = g->n;
	for (int r = 0; r < g->n; r++)
		mesh_coords(m, g->devs[r], out->coord[r]);
	free(g);
	return 0;
}

void mesh_members_free(struct mesh_members *x)
{
	free(x->coord);
	x->coord = NULL;
	x->n = 0;
}

void mesh_axes_text(const int *axes, int n, const char *sep, char *out, size_t outlen)
{
	size_t used = 0;
	out[0] = 0;
	for (int i = 0; i < n && used < outlen; i++)
		used += (size_t)snprintf(out + used, outlen - used, "%s%s", i ? sep : "",
					 mesh_axis_names[axes[i]]);
	if (!n)
		snprintf(out, outlen, "none");
}
