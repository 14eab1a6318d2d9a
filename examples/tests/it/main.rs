//! The integration tests of tchtrain-examples, one binary (a module per topic).

mod accelerate_loop;
mod custom_loss;
mod custom_model;
mod dataset_cache;
mod demo_pieces;
mod documents;
mod elastic;
mod examples;
mod examples_mlm_ner;
mod examples_seq2seq;
mod launch;
mod script_flags;
