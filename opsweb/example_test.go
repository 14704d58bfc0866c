package opsweb_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/idemflow/idemflow/engine"
	"github.com/idemflow/idemflow/idemflowtest"
	"github.com/idemflow/idemflow/opsweb"
)

// A service mounts the operators' handler beside its own routes, behind a
// secret of its operators: the pages at /ops, the JSON API at /ops/api.
func Example() {
	ctx := context.Background()
	pool, cleanup := idemflowtest.ExamplePool("example_opsweb")
	defer cleanup()
	send := func(context.Context, engine.Attempt, struct{}, *struct{}) error { return nil }
	op, err := engine.NewOperation("welcome_email", []engine.Step[struct{}, struct{}]{
		engine.ExternalStep("send", send),
	}, func(struct{}, *struct{}) (bool, error) { return true, nil }, nil)
	if err != nil {
		panic(err)
	}
	e, err := engine.New(pool, &engine.Config{Operations: []engine.Definition{op}})
	if err != nil {
		panic(err)
	}
	defer func() { _ = e.Stop(ctx) }()
	started, err := engine.Start(ctx, e, op, "client-1", "signup-42", struct{}{}, nil)
	if err != nil {
		panic(err)
	}
	if _, err := started.Wait(ctx); err != nil {
		panic(err)
	}

	ops, err := opsweb.New(e, &opsweb.Config{AuthFunc: opsweb.TokenAuth("s3cret")})
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/ops", ops)
	mux.Handle("/ops/", ops)
	srv := httptest.NewServer(mux)
	defer srv.Close()

	get := func(path, password string) *http.Response {
		req, err := http.NewRequest(http.MethodGet, srv.URL+path, nil)
		if err != nil {
			panic(err)
		}
		if password != "" {
			req.SetBasicAuth("anyone", password)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		return resp
	}
	resp := get("/ops/api/operations?client=client-1", "s3cret")
	var list struct {
		Operations []struct {
			Client, Name, Key, Status string
		} `json:"operations"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		panic(err)
	}
	_ = resp.Body.Close()
	fmt.Println(resp.Status, list.Operations)

	resp = get("/ops", "")
	_ = resp.Body.Close()
	fmt.Println(resp.Status, resp.Header.Get("WWW-Authenticate"))
	// Output:
	// 200 OK [{client-1 welcome_email signup-42 succeeded}]
	// 401 Unauthorized Basic realm="idemflow operations", charset="UTF-8"
}
