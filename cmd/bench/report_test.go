package main

import (
	"io"
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestMedianOf(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   []float64
		want float64
	}{
		{[]float64{3}, 3},
		{[]float64{5, 1, 3}, 3},
		{[]float64{4, 1, 3, 2}, 2.5},
	}
	for _, tc := range tests {
		require.Equal(t, tc.want, medianOf(tc.in), "%v", tc.in)
	}
	require.True(t, math.IsNaN(medianOf(nil)))
}

func TestParseOptions(t *testing.T) {
	t.Parallel()
	getenv := func(string) string { return "" }
	tests := []struct {
		args    []string
		wantErr string
	}{
		{[]string{"-rounds", "3"}, ""},
		{[]string{"-rounds", "0"}, "-rounds must be at least 1"},
		{[]string{"-n", "0"}, "-n must be at least 1"},
		{[]string{"-mode", "fast"}, "is not one of"},
	}
	for _, tc := range tests {
		o, err := parseOptions(tc.args, getenv, io.Discard)
		if tc.wantErr != "" {
			require.ErrorContains(t, err, tc.wantErr, "%v", tc.args)
			continue
		}
		require.NoError(t, err, "%v", tc.args)
		require.Equal(t, 3, o.rounds)
	}
}
