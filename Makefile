# Two commands on a fresh machine: `make demo` and `make test`.
# Where no NVIDIA GPU is present the CPU torch wheel is pinned first, so no multi-GB CUDA
# build is pulled; on a machine with CUDA torch already installed, see the README.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
TORCH_CPU := torch==2.13.0

.PHONY: demo test lint bench install dev clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	@if command -v nvidia-smi >/dev/null 2>&1; then \
		echo "NVIDIA GPU found: installing the default torch build"; \
	else \
		$(PIP) install -q "$(TORCH_CPU)"; \
	fi
	$(PIP) install -q -e ".[plot]"
	touch $@

$(VENV)/.dev: $(VENV)/.installed
	$(PIP) install -q -e ".[dev]"
	touch $@

install: $(VENV)/.installed
dev: $(VENV)/.dev

demo: $(VENV)/.installed
	$(VENV)/bin/kvbench demo --out runs/demo

test: $(VENV)/.dev
	$(PY) -m pytest -n 2 --dist worksteal --durations=15

lint: $(VENV)/.dev
	$(VENV)/bin/ruff check .

bench: $(VENV)/.installed
	$(PY) benchmarks/sim_speed.py

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache .hypothesis

# Mutation testing (slow, not part of `make test`; docs/MUTATION.md): engines first, then the
# metrics and trace validation, then the hybrid allocators, the verdicts, the sweep, and the real runner's
# host collector and prefill graphs, then chunked prefill, the outside-window terms and the arena copies,
# then the prefix-caching page pools, the calibration fit, the claims table, the step pricing and the KV
# budget, the calibration's held-out check, and the trace files, the public traces' loaders, the arrival
# processes and the vmm page geometry, the reproduction's figures; reports land in results/mutation/<scope>/
.PHONY: mutation
# the shared trace copies the workloads scope's tests read (mutmut's copy of the tree has no
# ../shared beside it): KVBENCH_TRACE_DIR where set, else ../shared/traces beside the clone
KVBENCH_TRACE_DIR ?= $(abspath $(CURDIR)/../shared/traces)
# chunked prefill's tests but the interpreted Triton ones (about 26 s, every surviving mutant would rerun them)
CHUNKED_TESTS = $(addprefix tests/test_chunked_prefill.py::,test_every_step_keeps_the_budget_runs_every_decode_and_chunks_in_arrival_order \
	test_a_first_token_comes_with_the_last_chunk test_coalesced_runs_match_step_by_step_runs_through_preemptions \
	test_chunked_prefill_lowers_the_decode_latency_of_a_prefill_heavy_trace \
	'test_the_real_model_decodes_the_same_tokens_with_prompts_in_chunks[paged-torch]' \
	test_static_engines_refuse_chunked_prefill test_a_budget_below_the_running_decodes_is_refused \
	test_requests_with_several_outputs_are_refused test_a_budget_below_the_model_length_is_taken_when_chunked \
	test_the_chunked_step_budget_is_2048_unless_set_whatever_the_model_length)
# the cost-term tests but the one that reads results/reference (not in mutmut's copy of the tree)
COST_TERMS_TESTS = $(addprefix tests/test_calibrate_cost_terms.py::,test_a_fit_on_runs_without_swaps_assumes_the_swap_cost_and_one_with_swaps_measures_it \
	test_an_assumed_swap_cost_is_the_roofline_of_the_simulated_block_size \
	test_an_older_cost_file_assumes_what_it_lacks test_bad_new_terms_in_a_cost_file_are_one_line \
	test_the_fit_finds_a_known_knee test_the_runner_charges_the_knee_on_decode_steps_only \
	test_a_batch_that_maps_pages_costs_exactly_that_much_more \
	test_mapping_ahead_reserves_the_next_segments_pages_and_prices_every_map_a_step_makes \
	test_a_vmm_run_counts_its_page_maps_and_the_fit_prices_them \
	test_a_coalesced_vmm_segment_pays_the_page_maps_its_steps_one_by_one_would \
	test_attention_pairs_count_what_each_query_sees \
	test_the_fit_recovers_a_known_attention_pair_price_and_steps_record_the_pairs)
# the held-out check's tests but those that read results/ or load tools/ (not in mutmut's copy of the tree)
HELD_OUT_TESTS = $(addprefix tests/test_calibrate_held_out.py::,test_a_held_out_run_of_a_fitted_trace_draw_is_dropped_and_the_rest_split_by_load \
	test_a_held_out_run_sharing_the_draw_is_never_fitted_nor_checked test_summaries_count_loaded_and_unloaded_runs_apart \
	test_an_older_sets_file_without_the_split_still_reads test_runs_set_aside_in_a_seed_folder_are_not_held_out \
	test_held_out_pages_open_with_the_split_and_rewrite_from_cost_json_alone)
# test_load's cases that read no committed results/ (mutmut's copy of the tree has none)
LOAD_TESTS = $(addprefix tests/test_load.py::,test_load_run_reads_a_simulated_run_as_the_files_hold_it \
	test_load_sweep_reads_a_sweep_the_real_sweep_wrote \
	test_numbers_read_back_exactly_as_written_words_and_gaps_as_they_are \
	test_a_broken_run_is_refused_in_one_line_naming_the_file)
CHECK_TESTS = $(HELD_OUT_TESTS) \
	$(addprefix tests/test_calibrate_latency.py::,test_the_runner_charges_a_segment_once_on_its_first_decode_step \
	test_the_fit_recovers_a_known_segment_cost_and_knee)
# the prefix-caching pools' tests but the real-model ones
CACHING_TESTS = $(addprefix tests/test_hybrid_prefix.py::,test_group_names \
	test_window_hits_skip_blocks_below_the_window_and_stop_at_a_gap test_the_request_hit_is_what_every_group_serves \
	test_a_sequence_registers_its_window_blocks_before_the_window_frees_them \
	test_references_lru_eviction_and_pages_returned_hybrid test_references_lru_eviction_and_pages_returned_jenga \
	test_random_runs_keep_exact_accounting test_simulated_runs_partition_the_arena_at_every_step \
	test_coalesced_segments_equal_step_by_step_with_the_cache test_summary_hit_tokens_per_group_by_hand)

mutation: $(VENV)/.dev
	$(PIP) install -q "mutmut==3.8.1"
	nice $(PY) tools/mutation.py --scope engines-core --paths engines/scheduler.py engines/preemption.py \
		engines/contiguous.py engines/arena.py engines/allocator.py engines/batch.py engines/beam.py \
		engines/groups.py engines/__init__.py --tests tests/test_engine_core_mutants.py tests/test_rules.py \
		tests/test_definitions.py tests/test_arena.py tests/test_allocators.py
	nice $(PY) tools/mutation.py --scope engines-paged --paths engines/paged.py engines/paged_prefix.py \
		engines/block_keys.py engines/prefix_cache.py engines/vmm.py \
		--tests tests/test_engine_paged_mutants.py tests/test_rules.py
	nice $(PY) tools/mutation.py --scope metrics --paths kvbench/metrics/occupancy.py kvbench/metrics/summary.py \
		kvbench/metrics/latency.py workloads/columns.py --tests tests/test_definitions.py \
		tests/test_trace_validation.py tests/test_rules.py tests/test_metrics.py tests/test_tracefile.py \
		tests/test_metric_mutants.py
	nice $(PY) tools/mutation.py --scope engines-hybrid --paths engines/hybrid.py engines/hybrid_prefix.py \
		--tests tests/test_hybrid.py tests/test_hybrid_prefix.py tests/test_block_table_upload.py \
		tests/test_hybrid_real.py tests/test_hybrid_mutants.py tests/test_hybrid_prefix_mutants.py
	nice $(PY) tools/mutation.py --scope verdicts --paths kvbench/reproduce/verdicts.py \
		kvbench/sweep/stats.py kvbench/sweep/sustained.py kvbench/reproduce/panel.py --tests tests/test_verdicts.py \
		tests/test_reproduce_verdicts.py tests/test_reproduce_seeds.py tests/test_sweep.py \
		tests/test_verdict_mutants.py tests/test_claims.py \
		tests/test_fig12_prefill_graphs_baselines.py::test_a_seed_is_read_from_its_own_cells_and_a_pending_cell_is_no_fail
	nice $(PY) tools/mutation.py --scope sweep --paths kvbench/sweep/deadline.py kvbench/sweep/rounds.py \
		kvbench/sweep/grid.py kvbench/sweep/files.py kvbench/sweep/run.py --tests tests/test_sweep.py tests/test_sweep_deadline.py \
		tests/test_sweep_executor.py tests/test_sweep_mutants.py
	nice $(PY) tools/mutation.py --scope real-host --paths kvbench/real/host.py kvbench/real/prefill_graphs.py \
		--tests tests/test_collectors.py tests/test_prefill_graphs.py
	nice $(PY) tools/mutation.py --scope engines-chunked --paths engines/chunked.py engines/windows.py \
		kvbench/real/kv_copies.py --tests $(CHUNKED_TESTS) tests/test_outside_window.py \
		tests/test_real_window_pricing.py tests/test_kv_copies.py tests/test_rules.py tests/test_chunked_mutants.py
	nice $(PY) tools/mutation.py --scope engines-caching-pages --timeout-multiplier 2 \
		--paths engines/caching_pages.py --tests $(CACHING_TESTS) tests/test_hybrid_prefix_mutants.py \
		tests/test_rules.py tests/test_caching_pages_mutants.py
	nice $(PY) tools/mutation.py --scope calibrate --paths kvbench/calibrate/fit.py \
		--tests tests/test_calibrate_mutants.py tests/test_calibrate.py $(HELD_OUT_TESTS) \
		tests/test_cost_file_loading.py tests/test_calibrate_read_rows.py tests/test_calibrate_command.py
	nice $(PY) tools/mutation.py --scope claims --paths kvbench/reproduce/claims.py \
		--tests tests/test_claims.py tests/test_reproduce_verdicts.py
	nice $(PY) tools/mutation.py --scope cost --paths kvbench/cost_model.py kvbench/budget.py \
		--tests tests/test_cost_mutants.py tests/test_cost_model_layers.py $(COST_TERMS_TESTS) \
		tests/test_cost_file_loading.py tests/test_kvspec_budget.py tests/test_sim_queueing.py tests/test_config.py \
		tests/test_definitions.py tests/test_preemption_costs.py tests/test_sim_vmm_map.py \
		tests/test_outside_window.py tests/test_real_window_pricing.py
	nice $(PY) tools/mutation.py --scope calibrate-check --paths kvbench/calibrate/check.py \
		--tests tests/test_calibrate_check_mutants.py $(CHECK_TESTS) tests/test_calibrate.py \
		tests/test_calibrate_command.py tests/test_calibrate_by_engine.py
	KVBENCH_TRACE_DIR=$(KVBENCH_TRACE_DIR) nice $(PY) tools/mutation.py --scope workloads \
		--paths workloads/arrivals.py workloads/realtraces.py workloads/tracefile.py workloads/tracedetect.py \
		kvbench/vmm/pages.py --tests tests/test_workloads_mutants.py tests/test_arrivals.py \
		tests/test_realtraces.py tests/test_tracefile.py tests/test_trace_validation.py tests/test_workloads.py \
		tests/test_vmm.py
	KVBENCH_TRACE_DIR=$(KVBENCH_TRACE_DIR) nice $(PY) tools/mutation.py --scope results-files \
		--paths kvbench/results/files.py kvbench/results/ownership.py kvbench/results/outputs.py \
		kvbench/results/packed.py --tests tests/test_results_files_mutants.py tests/test_outputs.py \
		tests/test_ownership.py tests/test_bad_inputs.py \
		tests/test_packed_tables.py::test_a_packed_run_loads_exactly_as_its_csvs \
		tests/test_packed_tables.py::test_packing_is_byte_exact_and_repeatable \
		tests/test_packed_tables.py::test_small_tables_stay_plain_and_a_missing_one_reads_empty \
		tests/test_packed_tables.py::test_a_cut_packed_table_is_refused_naming_it $(LOAD_TESTS)
	nice $(PY) tools/mutation.py --scope kvspec --paths kvbench/kvspec/layers.py kvbench/kvspec/model.py \
		kvbench/kvspec/config_json.py kvbench/kvspec/hf.py --tests tests/test_kvspec_mutants.py \
		tests/test_kvspec.py tests/test_layers.py tests/test_models_hf_config.py tests/test_cost_model_layers.py \
		tests/test_rope_scaling.py
	nice $(PY) tools/mutation.py --scope results-load --paths kvbench/results/load.py kvbench/results/shape.py \
		kvbench/results/checks.py --tests tests/test_results_load_mutants.py $(LOAD_TESTS) \
		tests/test_load.py::test_load_runs_is_one_row_per_run_with_its_settings_and_summary \
		tests/test_results_load.py::test_a_damaged_run_is_one_line_naming_the_file_and_key \
		tests/test_results_load.py::test_the_undamaged_run_loads_and_compare_and_report_show_it \
		tests/test_results_load.py::test_nan_where_kvbench_writes_it_loads_and_nowhere_else \
		tests/test_results_load.py::test_every_key_and_column_kvbench_always_writes_is_required \
		tests/test_results_load.py::test_the_required_columns_are_the_row_types_fields \
		tests/test_results_load.py::test_a_damaged_header_is_one_line_naming_its_line
	nice $(PY) tools/mutation.py --scope reproduce-figures --paths kvbench/reproduce/rows.py \
		kvbench/reproduce/engines.py kvbench/reproduce/sweeps.py kvbench/reproduce/sharing.py \
		--tests tests/test_reproduce_figures.py tests/test_reproduce.py tests/test_reproduce_verdicts.py \
		tests/test_reproduce_seeds.py tests/test_verdict_mutants.py tests/test_claims.py \
		tests/test_reproduce_prefill_graphs.py tests/test_reproduce_rows.py
