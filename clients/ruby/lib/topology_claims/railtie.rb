# frozen_string_literal: true

require "rails/railtie"

module TopologyClaims
  # The gem in a Rails application (loaded by `require "topology-claims"` when Rails is):
  #
  # - configuration, lowest first: the defaults, `config.x.topology_claims` (e.g. in
  #   config/environments/production.rb: `config.x.topology_claims.cell_id = "cell-eu"`), the
  #   credentials' `topology_claims:` section, then the TOPOLOGY_CLAIMS_* environment variables
  #   (an operator's override wins); config/initializers/topology_claims.rb may still
  #   `TopologyClaims.configure` anything after;
  # - the log subscriber for the `*.topology_claims` notifications (LogSubscriber);
  # - `rails topology_claims:install` and `rails topology_claims:verify_toml`.
  class Railtie < ::Rails::Railtie
    initializer "topology_claims.configuration", before: :load_config_initializers do |app|
      TopologyClaims.configuration = Railtie.configuration_for(app)
    end

    initializer "topology_claims.log_subscriber" do
      require "topology_claims/log_subscriber"
    end

    rake_tasks do
      load File.expand_path("tasks/topology_claims.rake", __dir__)
    end

    # The configuration of `app` (see the class comment for the order).
    def self.configuration_for(app, env: ENV)
      config = Configuration.new({})
      config.apply(app.config.x.topology_claims.to_h, source: "config.x.topology_claims")
      credentials = app.respond_to?(:credentials) ? app.credentials[:topology_claims] : nil
      config.apply(credentials, source: "credentials.topology_claims")
      config.apply_env(env)
    end
  end
end
