"""Tests of hybridflow.protocol (a package, so test module names cannot clash with other test folders)."""
