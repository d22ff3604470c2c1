# frozen_string_literal: true

# What Bundler requires for `gem "topology-claims"` (the gem's name): the library itself.
require_relative "topology_claims"
