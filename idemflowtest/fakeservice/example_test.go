package fakeservice_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/idemflow/idemflow/idemflowtest/fakeservice"
)

// post sends body to url under key and prints the answer, or that there was
// none.
func post(url, key, body string) {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		panic(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		fmt.Println("no answer")
		return
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		panic(err)
	}
	fmt.Println(resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), string(b))
}

// A client that sends its request twice under one key, as a retry does, makes
// one payment: the second request replays the first's answer.
func Example() {
	svc := fakeservice.New(nil)
	srv := httptest.NewServer(svc)
	defer srv.Close()

	post(srv.URL+"/payments", "pay-1", `{"amount":1499}`)
	post(srv.URL+"/payments", "pay-1", `{"amount":1499}`)
	fmt.Println("effects:", svc.Effects(), "requests:", svc.Requests())

	// Output:
	// 201  {"id":"fs_1","key":"pay-1","request":{"amount":1499}}
	// 201 true {"id":"fs_1","key":"pay-1","request":{"amount":1499}}
	// effects: 1 requests: 2
}

// An answer lost after the effect: the client hears nothing, asks by key
// whether the request was made, and finds it.
func ExampleService_FailNext() {
	svc := fakeservice.New(nil)
	srv := httptest.NewServer(svc)
	defer srv.Close()

	svc.FailNext(1, fakeservice.FaultLostResponse)
	post(srv.URL+"/payments", "pay-1", `{"amount":1499}`)

	resp, err := http.Get(srv.URL + "/by-key/pay-1")
	if err != nil {
		panic(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Println("lookup:", resp.StatusCode, string(b))
	fmt.Println("effects:", svc.Effects(), "duplicates:", len(svc.Duplicates()))

	// Output:
	// no answer
	// lookup: 200 {"id":"fs_1","key":"pay-1","request":{"amount":1499}}
	// effects: 1 duplicates: 0
}

// A fresh key on each attempt, instead of one derived key, pays twice:
// Duplicates shows it.
func ExampleService_Duplicates() {
	svc := fakeservice.New(nil)
	srv := httptest.NewServer(svc)
	defer srv.Close()

	svc.FailNext(1, fakeservice.FaultLostResponse)
	post(srv.URL+"/payments", "random-1", `{"amount":1499}`)
	post(srv.URL+"/payments", "random-2", `{"amount":1499}`)
	for _, d := range svc.Duplicates() {
		fmt.Printf("%s took effect under %q (%d requests)\n", d.Body, d.Keys, d.Requests)
	}

	// Output:
	// no answer
	// 201  {"id":"fs_2","key":"random-2","request":{"amount":1499}}
	// {"amount":1499} took effect under ["random-1" "random-2"] (2 requests)
}
