"""Test support: fakes of the remote services and an in-memory pipeline of scheduler, agents and supervisor."""
