// Package provider is the contract between marina's generic machine
// controller and the providers that make real machines (M2, M3): one small
// interface, keyed by the Machine's UID so that every call is idempotent and
// a restarted controller finds the machine it made before instead of making
// a second one.
//
// A provider owns one or more providerSpec kinds. The machine controller only
// hands it machines of those kinds; several providers run side by side, in
// the marina process or each in its own process built on this library (see
// Registry and the machine controller's options).
package provider
