# frozen_string_literal: true

# A minimal Rails application (what `rails new --minimal` keeps: ActiveRecord, ActionController),
# written by hand into a directory, with a scaffold-style UsersController answering JSON. Run
# in a process of its own (spec/support/rails_script.rb), so that Rails' globals never meet the
# other specs'.
module RailsApp
  module_function

  def write(root, database:)
    files = {
      "Gemfile" => "# the specs load Debian's gems directly\n",
      "config/application.rb" => <<~RUBY,
        require "rails"
        require "active_record/railtie"
        require "action_controller/railtie"
        $LOAD_PATH.unshift #{File.expand_path('../../lib', __dir__).inspect}
        require "topology-claims" # the Gemfile line: gem "topology-claims"

        module ClaimsApp
          class Application < Rails::Application
            config.load_defaults 6.1
            config.eager_load = false
            config.logger = Logger.new(ENV.fetch("TC_RAILS_LOG", File::NULL))
            config.log_level = :debug
            config.secret_key_base = "x" * 64
            config.hosts.clear
            config.x.topology_claims.address = "http://127.0.0.1:1" # overridden below
            config.x.topology_claims.timeout = "3s"
            config.x.topology_claims.cell_id = "from-config-x"
            config.credentials.content_path = Pathname(__dir__).join("credentials.yml.enc")
            config.credentials.key_path = Pathname(__dir__).join("master.key")
          end
        end
      RUBY
      "config/environment.rb" => <<~RUBY,
        require_relative "application"
        Rails.application.initialize!
      RUBY
      "config/database.yml" => <<~YAML,
        development:
          adapter: sqlite3
          database: #{database}
          pool: 5
          timeout: 5000
      YAML
      "config/routes.rb" => <<~RUBY,
        Rails.application.routes.draw { resources :users, only: %i[create update] }
      RUBY
      "app/models/application_record.rb" => <<~RUBY,
        class ApplicationRecord < ActiveRecord::Base
          self.abstract_class = true
        end
      RUBY
      "app/models/user.rb" => <<~RUBY,
        class User < ApplicationRecord
          include TopologyClaims::Claimable
          claims_owner :user
          claims_table :users
          claim :username, namespace: "usernames"
          claim :email, namespace: "emails", if: -> { email.present? }
        end
      RUBY
      # What `rails generate scaffold User username email --api` writes, minus the actions
      # this spec does not need.
      "app/controllers/users_controller.rb" => <<~RUBY,
        class UsersController < ActionController::API
          def create
            @user = User.new(user_params)
            if @user.save
              render json: @user, status: :created
            else
              render json: @user.errors, status: :unprocessable_entity
            end
          end

          def update
            @user = User.find(params[:id])
            if @user.update(user_params)
              render json: @user
            else
              render json: @user.errors, status: :unprocessable_entity
            end
          end

          private

          def user_params = params.require(:user).permit(:username, :email)
        end
      RUBY
      "db/migrate/20260101000000_create_users.rb" => <<~RUBY
        class CreateUsers < ActiveRecord::Migration[6.1]
          def change
            create_table :users do |t|
              t.string :username, null: false
              t.string :email
              t.timestamps
            end
          end
        end
      RUBY
    }
    files.each do |path, text|
      full = File.join(root, path)
      FileUtils.mkdir_p(File.dirname(full))
      File.write(full, text)
    end
  end

  # Writes config/credentials.yml.enc (and master.key) holding `yaml`.
  def write_credentials(root, yaml)
    require "active_support/encrypted_configuration"
    key_path = File.join(root, "config", "master.key")
    File.write(key_path, SecureRandom.hex(16))
    ActiveSupport::EncryptedConfiguration.new(
      config_path: File.join(root, "config", "credentials.yml.enc"), key_path: key_path,
      env_key: "RAILS_MASTER_KEY", raise_if_missing_key: true
    ).write(yaml)
  end
end
