package idemflowtest

import (
	"log/slog"
	"os"
)

// envLog names the environment variable that sets the level of the logs of
// the engines the kit makes (Engine, NewEngine, a Matrix's) when their
// configuration gives no Logger: a slog level ("debug", "info", "warn",
// "error", any case, or "info+2" and the like). Unset (or anything else), it
// is "warn": an engine's info lines (every step
// retried, every lookup) stay out of the test output, and what needs a look
// stays in (see the package documentation, "Logs").
const envLog = "IDEMFLOWTEST_LOG"

// logger returns the logger of the kit's engines: to stderr, at the level
// that envLog names.
func logger() *slog.Logger {
	level := slog.LevelWarn
	if err := level.UnmarshalText([]byte(os.Getenv(envLog))); err != nil {
		level = slog.LevelWarn
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}
