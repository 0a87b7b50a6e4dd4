"""Device-side plumbing that kernels and primitives share: inline-PTX codegen helpers
(``intrinsics``), 16-byte vector accesses (``vector_access``), views of dynamic shared memory
(``carve``) and the shared-memory bank model (``banks``)."""
