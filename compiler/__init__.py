"""The `.grad` compiler: AST -> typed SSA IR -> autodiff -> passes -> fused
Numba source.  `compiler.pipeline` lists the stages in order."""
