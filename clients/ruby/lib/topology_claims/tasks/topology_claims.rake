# frozen_string_literal: true

namespace :topology_claims do
  desc "Write config/initializers/topology_claims.rb and a migration that creates the gem's local tables"
  task install: :environment do
    require "topology_claims/install"
    TopologyClaims::Install.run(Rails.root, out: $stdout)
  end

  desc "Print the verify.toml of every claimable model (eager-loads the app); FILE=path writes it there"
  task verify_toml: :environment do
    toml = TopologyClaims.verify_toml
    if ENV["FILE"]
      File.write(ENV["FILE"], toml)
      warn "wrote #{ENV['FILE']} (#{toml.bytesize} bytes)"
    else
      $stdout.write(toml)
    end
  end
end
