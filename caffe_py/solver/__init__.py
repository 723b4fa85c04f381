"""The solver: lr policies (lr_policy), the update rules (rules), one replica's training loop
(solver: Solver), its roles and step functions (roles), CUDA-graph steps (graphs), snapshots
(snapshot, caffemodel), signals and the callback interface. Import from the submodules: this
package imports nothing, so a torch-free one (signals) stays torch-free."""
