// The logger vram run gives its memory managers: the command's, with the
// library's warning that a client's requests are many times the memory
// its group may use demoted to debug. A batch bigger than the device is
// what vram run is for; its report gives the chunks, and -v still shows
// the warning.

package main

import (
	"context"
	"log/slog"

	"github.com/vramkit/vram"
)

// managerLogger is the logger for the job's managers.
func (a *app) managerLogger() *slog.Logger {
	return slog.New(demoteHandler{a.log.Handler()})
}

// demoteHandler passes records to h, the chunking warning at debug level.
type demoteHandler struct{ h slog.Handler }

func (d demoteHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return d.h.Enabled(ctx, l) || (l == slog.LevelWarn && d.h.Enabled(ctx, slog.LevelDebug))
}

func (d demoteHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level == slog.LevelWarn && r.Message == vram.RequestWarning {
		r.Level = slog.LevelDebug
	}
	if !d.h.Enabled(ctx, r.Level) {
		return nil
	}
	return d.h.Handle(ctx, r)
}

func (d demoteHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return demoteHandler{d.h.WithAttrs(as)}
}
func (d demoteHandler) WithGroup(g string) slog.Handler { return demoteHandler{d.h.WithGroup(g)} }
