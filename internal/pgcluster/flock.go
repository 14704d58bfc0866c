package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"
)

// lockPollInterval is how often lockFile retries while another process holds the lock.
const lockPollInterval = 25 * time.Millisecond

// lockFile takes an exclusive flock on path, creating the file if needed, and returns
// the function that releases it. It waits while another process (or another open file
// in this process) holds the lock, until ctx is done. The lock is released by the
// kernel if the process dies, so a killed process never leaves it held.
func lockFile(ctx context.Context, path string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("pgcluster: open lock file: %w", err)
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { _ = f.Close() }, nil // closing the file releases the lock
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			_ = f.Close()
			return nil, fmt.Errorf("pgcluster: lock %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			_ = f.Close()
			return nil, fmt.Errorf("pgcluster: wait for lock %s: %w", path, context.Cause(ctx))
		case <-time.After(lockPollInterval):
		}
	}
}
