package engine

import (
	"errors"
	"math"
	"time"
)

// RetryPolicy says how often and how fast a step that failed transiently is tried
// again. Attempt n (n >= 2) starts Base * Factor^(n-2) after attempt n-1 failed,
// at most Cap.
type RetryPolicy struct {
	// Base is the delay before the second attempt. Defaults to 1 second.
	Base time.Duration
	// Factor multiplies the delay after each attempt. Defaults to 2.
	Factor float64
	// Cap bounds the delay. Defaults to 5 minutes.
	Cap time.Duration
	// MaxAttempts is the number of attempts after which a step that still fails
	// transiently fails the operation; it bounds an external step's calls:
	// out of attempts, an external step whose outcome is unknown sends
	// nothing more and only asks its lookup until the outcome is known (see
	// ExternalStepDef.Window). An attempt of a transactional step that failed
	// because the database did not answer (IsUnavailable) does not count.
	// Defaults to 10.
	MaxAttempts int
}

// merged returns p with its zero fields taken from fallback.
func (p RetryPolicy) merged(fallback RetryPolicy) RetryPolicy {
	if p.Base == 0 {
		p.Base = fallback.Base
	}
	if p.Factor == 0 {
		p.Factor = fallback.Factor
	}
	if p.Cap == 0 {
		p.Cap = fallback.Cap
	}
	if p.MaxAttempts == 0 {
		p.MaxAttempts = fallback.MaxAttempts
	}
	return p
}

func (p RetryPolicy) withDefaults() RetryPolicy {
	return p.merged(RetryPolicy{
		Base:        defaultRetryBase,
		Factor:      defaultRetryFactor,
		Cap:         defaultRetryCap,
		MaxAttempts: defaultRetryMaxAttempts,
	})
}

func (p RetryPolicy) validate() error {
	switch {
	case p.Base < 0:
		return errors.New("retry base must not be negative")
	case p.Factor != 0 && p.Factor < 1:
		return errors.New("retry factor must be at least 1")
	case p.Cap < 0:
		return errors.New("retry cap must not be negative")
	case p.MaxAttempts < 0:
		return errors.New("retry max attempts must not be negative")
	}
	return nil
}

// Backoff returns the delay after failed attempt number attempt (from 1) before
// the next one.
func (p RetryPolicy) Backoff(attempt int) time.Duration {
	p = p.withDefaults()
	if attempt < 1 {
		attempt = 1
	}
	d := float64(p.Base) * math.Pow(p.Factor, float64(attempt-1))
	if d > float64(p.Cap) || math.IsInf(d, 0) || math.IsNaN(d) {
		return p.Cap
	}
	return time.Duration(d)
}
