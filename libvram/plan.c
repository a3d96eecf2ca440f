/*
 * plan.c: vram_plan, the planner alone (plan.go).
 */
#include "internal.h"
#include "_cgo_export.h"

int vram_plan(const char *request_json, char *buf, size_t len, size_t *needed) {
	if (forked("vram_plan")) return VRAM_EFORK;
	if (!request_json) return fail(VRAM_EINVAL, "vram_plan: request_json is NULL");
	char *err = NULL, *text = NULL;
	int rc = vramgo_plan((char *)request_json, &text, &err);
	set_error(err);
	return copy_text(rc, text, buf, len, needed);
}
