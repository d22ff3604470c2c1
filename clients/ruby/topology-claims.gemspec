# frozen_string_literal: true

require_relative "lib/topology_claims/version"

# The files below are relative to this directory, and `gem build` reads them from the current
# one: a build from anywhere else would list nothing (Debian's rubygems does not change
# directory itself). Bundler already loads a gemspec from its own directory, inside a chdir
# block of its own, where another chdir only warns ("conflicting chdir").
Dir.chdir(__dir__) unless File.identical?(Dir.pwd, __dir__)

Gem::Specification.new do |spec|
  spec.name = "topology-claims"
  spec.version = TopologyClaims::VERSION
  spec.summary = "Ruby client and ActiveRecord integration of topology-claims (globally unique claims of a multi-cell platform)"
  spec.description = <<~TEXT
    A typed gRPC client of topology.claims.v1.ClaimsService and TopologyClaims::Claimable, an
    ActiveRecord concern that turns declared attributes into claims: one lease per outermost
    transaction, sent just before COMMIT, refusals as validation errors.
  TEXT
  spec.license = "Apache-2.0"
  spec.authors = ["topology-claims contributors"]
  spec.required_ruby_version = ">= 3.1"
  spec.files = Dir["lib/**/*.{rb,yml,rake}", "bin/generate-stubs", "README.md"]
  spec.require_paths = ["lib"]
  spec.add_dependency "google-protobuf", ">= 3.21", "< 5"
  spec.add_dependency "googleapis-common-protos-types", ">= 1.3"
  spec.add_dependency "grpc", ">= 1.51"
  spec.add_development_dependency "activerecord", ">= 6.1"
  spec.add_development_dependency "pg", ">= 1.2"
  spec.add_development_dependency "rspec", ">= 3.10"
  spec.add_development_dependency "sqlite3", ">= 1.4"
  spec.metadata["rubygems_mfa_required"] = "true"
end
