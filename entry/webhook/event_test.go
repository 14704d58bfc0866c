package webhook_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemflow/idemflow/entry/webhook"
)

func TestParseEvent(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		body string
		want webhook.Event
		err  string // "" when it parses
	}{
		{name: "id and type", body: `{"id":"evt_1","type":"payment.succeeded","data":{"amount":1}}`, want: webhook.Event{ID: "evt_1", Type: "payment.succeeded"}},
		{name: "no type", body: ` {"id":"evt_1"} `, want: webhook.Event{ID: "evt_1"}},
		{name: "null type", body: `{"id":"evt_1","type":null}`, want: webhook.Event{ID: "evt_1"}},
		{name: "escaped id", body: `{"id":"evt_\u00e9"}`, want: webhook.Event{ID: "evt_é"}},
		{name: "empty", body: ``, err: "the body is not JSON"},
		{name: "not JSON", body: `id=evt_1`, err: "the body is not JSON"},
		{name: "trailing garbage", body: `{"id":"evt_1"} x`, err: "the body is not JSON"},
		{name: "array", body: `[{"id":"evt_1"}]`, err: "the body is not a JSON object"},
		{name: "string", body: `"evt_1"`, err: "the body is not a JSON object"},
		{name: "no id", body: `{"type":"payment.succeeded"}`, err: "the event has no id"},
		{name: "null id", body: `{"id":null}`, err: "the event has no id"},
		{name: "empty id", body: `{"id":""}`, err: "the event has no id"},
		{name: "number id", body: `{"id":7}`, err: "the event's id and type must be strings"},
		{name: "object type", body: `{"id":"evt_1","type":{}}`, err: "the event's id and type must be strings"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ev, err := webhook.ParseEvent([]byte(tt.body))
			if tt.err != "" {
				require.EqualError(t, err, tt.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, ev)
		})
	}
}
